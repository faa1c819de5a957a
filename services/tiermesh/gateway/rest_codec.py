"""KServe v2 REST (JSON, and Triton's binary-data extension) <-> the gateway's domain types.

Pure: no HTTP framework, no gRPC server. A request body is a JSON document, optionally
followed by binary tensor data when the `Inference-Header-Content-Length` header gives the
JSON part's length; an input whose `parameters.binary_data_size` is set takes that many
bytes of the binary part, in the order of the inputs. Outputs go back as binary when the
request asks (`outputs[].parameters.binary_data`, or `parameters.binary_data_output` for
all), else as JSON `data` (row-major, flattened).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format  # type: ignore[import-untyped]

from tiermesh.core.controls import PARAMETERS as CONTROL_PARAMETERS
from tiermesh.core.errors import MeshError, invalid, shown
from tiermesh.core.jobs import JobResult
from tiermesh.core.repository import ModelConfig, TensorSpec
from tiermesh.core.tensors import BYTES, DATATYPES, TensorData, join_bytes, split_bytes
from tiermesh.core.validation import MAX_LISTED_ELEMENTS, Screen, no_screen
from tiermesh.gateway import converters
from tiermesh.gateway.converters import MAX_INPUTS, MAX_RANK, tensor_shape
from tiermesh.gateway.facts import response_facts
from tiermesh.gateway.generation import PARAMETERS as GENERATION_PARAMETERS
from tiermesh.gateway.plane import ServerInfo
from tiermesh.gateway.requests import InferRequest, controls_of

HEADER_LENGTH = "Inference-Header-Content-Length"

# One table with DESIGN.md's gRPC codes (the v2 REST codes Triton uses where it has one).
_HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    # A model load refused (its files do not match their checksums): Triton answers 400.
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.INTERNAL: 500,
}


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status of a gRPC status code (500 for any the table lacks)."""
    return _HTTP_STATUS.get(code, 500)


def retry_after_s(retry_after_ms: int) -> int:
    """HTTP's Retry-After is whole seconds: rounded up, at least 1."""
    return max(1, math.ceil(retry_after_ms / 1000))


@dataclass(frozen=True, slots=True)
class OutputChoice:
    """Which outputs the caller wants as binary data (the rest as JSON)."""

    all_binary: bool = False
    binary: frozenset[str] = frozenset()

    def is_binary(self, name: str) -> bool:
        return self.all_binary or name in self.binary


# numpy dtype of each fixed-size datatype sent as JSON, and the JSON types its elements take.
_JSON_DTYPES: dict[str, tuple[str, tuple[type, ...]]] = {
    "BOOL": ("?", (bool,)),
    "INT8": ("<i1", (int,)),
    "INT16": ("<i2", (int,)),
    "INT32": ("<i4", (int,)),
    "INT64": ("<i8", (int,)),
    "UINT8": ("<u1", (int,)),
    "UINT16": ("<u2", (int,)),
    "UINT32": ("<u4", (int,)),
    "UINT64": ("<u8", (int,)),
    "FP16": ("<f2", (int, float)),
    "FP32": ("<f4", (int, float)),
    "FP64": ("<f8", (int, float)),
}


# The JSON part of a request body (its header, with the binary extension): json.loads holds
# the event loop ~5 ms a MiB and ~75 ns a value, building an object per value. Tensors larger
# than this travel as binary data (the extension every KServe v2 REST client has).
MAX_JSON_BYTES = 8 << 20
# Values (commas + 1, counted before parsing, ~1 ms a MiB: a comma inside a string counts
# too) the JSON may list: ~20 ms of parsing at most, where 4 M zeros in 8 MB held the loop
# 300 ms before their count was compared with the shape.
MAX_JSON_VALUES = 1 << 18


def json_object(data: bytes) -> dict[str, Any]:
    if len(data) > MAX_JSON_BYTES:
        raise invalid(
            f"the JSON of the request body is {len(data)} bytes, over the limit of "
            f"{MAX_JSON_BYTES}; send large tensors as binary data (binary_data_size)"
        )
    if (values := data.count(b",") + 1) > MAX_JSON_VALUES:
        raise invalid(
            f"the JSON of the request body lists {values} values (commas), over the limit of "
            f"{MAX_JSON_VALUES}; send large tensors as binary data (binary_data_size)"
        )
    try:
        doc = json.loads(data)
    except UnicodeDecodeError:
        raise invalid("malformed JSON in the request body: not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise invalid(
            f"malformed JSON in the request body: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise invalid("malformed JSON in the request body: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise invalid(f"malformed JSON in the request body: {shown(str(exc), 80)}") from None
    if not isinstance(doc, dict):
        raise invalid("the request body must be a JSON object")
    return doc


def _int_param(params: Mapping[str, Any], key: str) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid(f"parameter '{key}' must be an integer")
    return value


def _str_param(params: Mapping[str, Any], key: str) -> str:
    value = params.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"parameter '{key}' must be a string")
    return value


def _params(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise invalid(f"{where}: 'parameters' must be a JSON object")
    return params


def _flatten(data: Any, name: str, count: int) -> list[Any]:
    """Nested JSON lists, row-major; scalars as they are. The walk stops one value past
    `count`: a list of millions of values for a small shape costs what the shape does."""
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack and len(out) <= count:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
            if len(out) > count:
                break
        else:
            stack.pop()
    return out


def _json_tensor(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> bytes:
    count = math.prod(shape)
    if count > MAX_LISTED_ELEMENTS:
        raise invalid(
            f"input '{shown(name)}': {count} values in 'data', over the limit of "
            f"{MAX_LISTED_ELEMENTS}; send larger tensors as binary data"
        )
    items = _flatten(data, name, count)
    if len(items) != count:
        shown_count = f"more than {count}" if len(items) > count else str(len(items))
        raise invalid(
            f"input '{shown(name)}': {shown_count} values in 'data' for shape {list(shape)} "
            f"({count} values)"
        )
    if datatype == BYTES:
        if not all(isinstance(i, str) for i in items):
            raise invalid(f"input '{shown(name)}': BYTES data must be JSON strings")
        return join_bytes([i.encode("utf-8") for i in items])
    if datatype not in _JSON_DTYPES:
        raise invalid(f"input '{shown(name)}': {datatype} data must be sent as binary data")
    dtype, kinds = _JSON_DTYPES[datatype]
    for item in items:
        # bool is an int in Python: only BOOL takes true/false, and BOOL takes nothing else.
        if isinstance(item, bool) != (datatype == "BOOL") or not isinstance(item, kinds):
            raise invalid(
                f"input '{shown(name)}': value {shown(json.dumps(item), 32)} is not of "
                f"datatype {datatype}"
            )
    try:
        return bytes(np.asarray(items, dtype=dtype).tobytes())
    except (OverflowError, ValueError):
        raise invalid(f"input '{shown(name)}': a value does not fit {datatype}") from None


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in raw
    ):
        raise invalid(f"input '{shown(name)}': 'shape' must be a list of integers")
    if len(raw) > MAX_RANK:
        raise invalid(f"input '{shown(name)}': rank {len(raw)} over the limit of {MAX_RANK}")
    return tuple(raw)


def parse_infer(
    body: bytes,
    header_length: int | None,
    model: str,
    version: str,
    screen: Screen = no_screen,
) -> tuple[InferRequest, OutputChoice]:
    """The domain request of a REST infer call; INVALID_ARGUMENT naming what is wrong, or
    what `screen` refuses of an input before its data is read."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise invalid(f"{HEADER_LENGTH} {header_length} does not fit a body of {len(body)} bytes")
    split = len(body) if header_length is None else header_length
    doc = json_object(body[:split])
    binary = memoryview(body)[split:]
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise invalid("the request needs 'inputs': a list of tensors")
    if len(raw_inputs) > MAX_INPUTS:
        raise invalid(f"{len(raw_inputs)} inputs, over the limit of {MAX_INPUTS}")
    offset = 0
    inputs = []
    for t in raw_inputs:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise invalid("each input must be a JSON object with a 'name'")
        name = t["name"]
        datatype = t.get("datatype")
        if not isinstance(datatype, str) or datatype not in DATATYPES:
            raise invalid(
                f"input '{shown(name)}': unknown datatype {shown(json.dumps(datatype), 32)}"
            )
        shape = _shape(t.get("shape"), name)
        screen(name, datatype, shape)
        size = _int_param(_params(t, f"input '{shown(name)}'"), "binary_data_size")
        if size is not None:
            if "data" in t:
                raise invalid(f"input '{shown(name)}': both 'data' and binary_data_size given")
            if size < 0 or offset + size > len(binary):
                raise invalid(
                    f"input '{shown(name)}': binary_data_size {size} goes past the "
                    f"{len(binary)} bytes of binary data"
                )
            raw = bytes(binary[offset : offset + size])
            offset += size
        elif "data" in t:
            if any(d < 0 for d in shape):
                raise invalid(f"input '{shown(name)}': every dimension must be positive")
            raw = _json_tensor(name, datatype, shape, t["data"])
        else:
            raise invalid(f"input '{shown(name)}': no 'data' and no binary_data_size")
        inputs.append(TensorData(name, datatype, shape, raw))
    if offset != len(binary):
        raise invalid(
            f"{len(binary) - offset} bytes of binary data after the last input's; "
            "binary_data_size must account for all of it"
        )
    params = _params(doc, "request")
    raw_outputs = doc.get("outputs") or []
    if not isinstance(raw_outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in raw_outputs
    ):
        raise invalid("'outputs' must be a list of JSON objects with a 'name'")
    binary_out = frozenset(
        o["name"] for o in raw_outputs if _params(o, "output").get("binary_data") is True
    )
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid("'id' must be a string")
    req = InferRequest(
        model=model,
        version=version,
        inputs=tuple(inputs),
        client_request_id=request_id,
        requested_outputs=tuple(o["name"] for o in raw_outputs),
        priority=_int_param(params, "priority") or 0,
        timeout_us=_int_param(params, "timeout"),
        variant=_str_param(params, "variant"),
        controls=controls_of({k: params[k] for k in CONTROL_PARAMETERS if k in params}),
        parameters={k: params[k] for k in GENERATION_PARAMETERS if k in params},
    )
    return req, OutputChoice(params.get("binary_data_output") is True, binary_out)


def _json_data(t: TensorData) -> list[Any]:
    count = math.prod(t.shape)
    if t.datatype == BYTES:
        # JSON carries text; bytes that are not UTF-8 come back replaced (ask for binary).
        return [i.decode("utf-8", "replace") for i in split_bytes(t.raw, count, t.name)]
    dtype = _JSON_DTYPES[t.datatype][0] if t.datatype in _JSON_DTYPES else None
    if dtype is None:
        raise MeshError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"output '{t.name}' ({t.datatype}) can only be returned as binary data",
        )
    values: list[Any] = np.frombuffer(t.raw, dtype=dtype).tolist()
    return values


def infer_body(
    result: JobResult, responded_ns: int, cache_hit: bool, choice: OutputChoice
) -> tuple[bytes, int | None]:
    """The response body and, when binary data follows the JSON, the JSON part's length."""
    outputs = []
    blobs: list[bytes] = []
    for t in result.outputs:
        out: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if choice.is_binary(t.name):
            out["parameters"] = {"binary_data_size": len(t.raw)}
            blobs.append(t.raw)
        else:
            out["data"] = _json_data(t)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": result.model, "model_version": result.version}
    if result.client_request_id:
        doc["id"] = result.client_request_id
    doc["parameters"] = response_facts(result, responded_ns, cache_hit)
    doc["outputs"] = outputs
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, None
    return head + b"".join(blobs), len(head)


def server_doc(info: ServerInfo) -> dict[str, Any]:
    return {"name": info.name, "version": info.version, "extensions": list(info.extensions)}


def _tensor_doc(cfg: ModelConfig, spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": tensor_shape(cfg, spec)}


def metadata_doc(cfg: ModelConfig) -> dict[str, Any]:
    """The model's metadata as the v2 REST protocol gives it: the JSON mapping of gRPC's
    ModelMetadataResponse (empty fields left out), with numeric shapes."""
    doc: dict[str, Any] = {"name": cfg.name}
    if cfg.versions:
        doc["versions"] = [v.version for v in cfg.versions]
    if cfg.platform:
        doc["platform"] = cfg.platform
    doc["inputs"] = [_tensor_doc(cfg, spec) for spec in cfg.inputs]
    doc["outputs"] = [_tensor_doc(cfg, spec) for spec in cfg.outputs]
    return doc


def config_doc(cfg: ModelConfig) -> dict[str, Any]:
    """The model's configuration as Triton's REST endpoint gives it: the JSON mapping of
    Triton's ModelConfig message (model_config.proto is its schema), with numeric dims."""
    config = converters.model_config(cfg).config
    doc: dict[str, Any] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for key in ("input", "output"):
        doc[key] = [{**t, "dims": [int(d) for d in t.get("dims", [])]} for t in doc.get(key, [])]
    return doc
