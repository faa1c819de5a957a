"""KServe v2 (package `inference`, as tritonclient ships it) <-> gateway domain types."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2, service_pb2

from tiermesh.core.controls import PARAMETERS as CONTROL_PARAMETERS
from tiermesh.core.errors import invalid, shown, shown_shape
from tiermesh.core.jobs import JobResult
from tiermesh.core.repository import ModelConfig, TensorSpec
from tiermesh.core.tensors import BYTES, TensorData, element_count, join_bytes
from tiermesh.core.v2_parameters import set_parameter
from tiermesh.core.validation import MAX_LISTED_ELEMENTS, Screen, no_screen
from tiermesh.gateway.facts import response_facts
from tiermesh.gateway.generation import PARAMETERS as GENERATION_PARAMETERS
from tiermesh.gateway.plane import ServerInfo
from tiermesh.gateway.requests import InferRequest, controls_of

# InferTensorContents field and numpy dtype for each datatype a client may send typed.
_CONTENTS: dict[str, tuple[str, str]] = {
    "BOOL": ("bool_contents", "?"),
    "INT8": ("int_contents", "<i1"),
    "INT16": ("int_contents", "<i2"),
    "INT32": ("int_contents", "<i4"),
    "INT64": ("int64_contents", "<i8"),
    "UINT8": ("uint_contents", "<u1"),
    "UINT16": ("uint_contents", "<u2"),
    "UINT32": ("uint_contents", "<u4"),
    "UINT64": ("uint64_contents", "<u8"),
    "FP32": ("fp32_contents", "<f4"),
    "FP64": ("fp64_contents", "<f8"),
}
# The typed fields of InferTensorContents, each once.
TYPED_FIELDS = tuple(dict.fromkeys(field for field, _ in _CONTENTS.values()))


# Far beyond any model the mesh serves; refused before a request's lists are walked (a 64 MiB
# message could otherwise carry millions of dimensions or inputs).
MAX_RANK = 32
MAX_INPUTS = 256


def _param_int(params: object, key: str) -> int | None:
    p = params[key] if key in params else None  # type: ignore[operator,index]
    if p is None:
        return None
    which = p.WhichOneof("parameter_choice")
    if which in ("int64_param", "uint64_param"):
        return int(getattr(p, which))
    raise invalid(f"parameter '{key}' must be an integer, got {which}")


def _param_str(params: object, key: str) -> str:
    p = params[key] if key in params else None  # type: ignore[operator,index]
    if p is None:
        return ""
    if p.WhichOneof("parameter_choice") != "string_param":
        raise invalid(f"parameter '{key}' must be a string")
    return str(p.string_param)


def _param_values(params: object, keys: tuple[str, ...]) -> dict[str, object]:
    """The named request parameters as Python values, for checks that know their types."""
    out: dict[str, object] = {}
    for key in keys:
        if key in params:  # type: ignore[operator]
            p = params[key]  # type: ignore[index]
            which = p.WhichOneof("parameter_choice")
            out[key] = getattr(p, which) if which else None
    if isinstance(stop := out.get("stop"), str) and stop.startswith("["):
        try:  # a list of stop strings travels as one JSON string parameter
            out["stop"] = json.loads(stop)
        except ValueError:
            raise invalid("parameter 'stop': a JSON list of strings expected") from None
    return out


def _typed_contents(
    t: service_pb2.ModelInferRequest.InferInputTensor, shape: tuple[int, ...]
) -> bytes:
    """The raw bytes of typed contents, built only once their count matches the shape (the
    length of a repeated field is known without reading it)."""
    contents = t.contents
    if t.datatype == BYTES:
        values: Any = contents.bytes_contents
    elif t.datatype in _CONTENTS:
        field, dtype = _CONTENTS[t.datatype]
        values = getattr(contents, field)
    else:
        raise invalid(
            f"input '{shown(t.name)}': datatype {shown(t.datatype)} must be sent as raw contents"
        )
    count = element_count(shape)
    if len(values) != count:
        raise invalid(
            f"input '{shown(t.name)}': contents hold {len(values)} elements, shape "
            f"{shown_shape(shape)} needs {count}"
        )
    if count > MAX_LISTED_ELEMENTS:
        raise invalid(
            f"input '{shown(t.name)}': {count} typed elements, over the limit of "
            f"{MAX_LISTED_ELEMENTS}; send larger tensors as raw_input_contents"
        )
    if t.datatype == BYTES:
        return join_bytes(values)
    try:
        return bytes(np.fromiter(values, dtype=dtype, count=count).tobytes())
    except (OverflowError, ValueError):
        raise invalid(
            f"input '{shown(t.name)}': a value does not fit {shown(t.datatype)}"
        ) from None


def infer_request(msg: service_pb2.ModelInferRequest, screen: Screen = no_screen) -> InferRequest:
    """The domain request; INVALID_ARGUMENT for framing the protocol itself forbids, and
    for what `screen` refuses."""
    if len(msg.inputs) > MAX_INPUTS:
        raise invalid(f"{len(msg.inputs)} inputs, over the limit of {MAX_INPUTS}")
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise invalid(f"raw_input_contents has {len(raw)} entries for {len(msg.inputs)} inputs")
    inputs = []
    for i, t in enumerate(msg.inputs):
        if raw and t.contents.ByteSize():
            # Which of the two would the caller mean? Triton refuses the mix too.
            raise invalid(
                f"input '{shown(t.name)}': contents given beside raw_input_contents; send every "
                "input one way"
            )
        if len(t.shape) > MAX_RANK:
            raise invalid(
                f"input '{shown(t.name)}': rank {len(t.shape)} over the limit of {MAX_RANK}"
            )
        shape = tuple(int(d) for d in t.shape)
        screen(t.name, t.datatype, shape)
        data = raw[i] if raw else _typed_contents(t, shape)
        inputs.append(TensorData(t.name, t.datatype, shape, data))
    priority = _param_int(msg.parameters, "priority") or 0
    return InferRequest(
        model=msg.model_name,
        version=msg.model_version,
        inputs=tuple(inputs),
        client_request_id=msg.id,
        requested_outputs=tuple(o.name for o in msg.outputs),
        priority=priority,
        timeout_us=_param_int(msg.parameters, "timeout"),
        variant=_param_str(msg.parameters, "variant"),
        controls=controls_of(_param_values(msg.parameters, CONTROL_PARAMETERS)),
        parameters=_param_values(msg.parameters, GENERATION_PARAMETERS),
    )


def infer_response(
    result: JobResult, responded_ns: int, cache_hit: bool = False
) -> service_pb2.ModelInferResponse:
    """The KServe response, with the request's time breakdown and facts as parameters."""
    resp = service_pb2.ModelInferResponse(
        model_name=result.model, model_version=result.version, id=result.client_request_id
    )
    for t in result.outputs:
        resp.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        resp.raw_output_contents.append(t.raw)
    for key, value in response_facts(result, responded_ns, cache_hit).items():
        set_parameter(resp.parameters[key], value)
    return resp


# Triton's response parameter that marks the last response of a request on a stream.
FINAL_RESPONSE = "triton_final_response"


def piece_response(result: JobResult, piece: TensorData) -> service_pb2.ModelInferResponse:
    """A streamed piece of a generative answer: its text and nothing more, not final."""
    resp = service_pb2.ModelInferResponse(
        model_name=result.model, model_version=result.version, id=result.client_request_id
    )
    resp.outputs.add(name=piece.name, datatype=piece.datatype, shape=piece.shape)
    resp.raw_output_contents.append(piece.raw)
    resp.parameters[FINAL_RESPONSE].bool_param = False
    return resp


def tensor_shape(cfg: ModelConfig, spec: TensorSpec) -> list[int]:
    """A tensor's shape in the model's metadata: -1 first for the batch dimension."""
    return [-1, *spec.dims] if cfg.max_batch_size > 0 else list(spec.dims)


def server_metadata(info: ServerInfo) -> service_pb2.ServerMetadataResponse:
    return service_pb2.ServerMetadataResponse(
        name=info.name, version=info.version, extensions=info.extensions
    )


def model_metadata(cfg: ModelConfig) -> service_pb2.ModelMetadataResponse:
    resp = service_pb2.ModelMetadataResponse(
        name=cfg.name, versions=[v.version for v in cfg.versions], platform=cfg.platform
    )
    for spec in cfg.inputs:
        resp.inputs.add(name=spec.name, datatype=spec.datatype, shape=tensor_shape(cfg, spec))
    for spec in cfg.outputs:
        resp.outputs.add(name=spec.name, datatype=spec.datatype, shape=tensor_shape(cfg, spec))
    return resp


def _config_type(datatype: str) -> int:
    return int(
        model_config_pb2.DataType.Value("TYPE_STRING" if datatype == BYTES else f"TYPE_{datatype}")
    )


# The ModelConfig parameter naming the execution providers the model's tiers ask for.
EXECUTION_PROVIDERS = "execution_providers"


def model_config(cfg: ModelConfig) -> service_pb2.ModelConfigResponse:
    config = model_config_pb2.ModelConfig(
        name=cfg.name,
        platform=cfg.platform,
        backend="onnxruntime",
        max_batch_size=cfg.max_batch_size,
        default_model_filename=cfg.model_file,
    )
    for spec in cfg.inputs:
        config.input.add(name=spec.name, data_type=_config_type(spec.datatype), dims=spec.dims)
    for spec in cfg.outputs:
        config.output.add(name=spec.name, data_type=_config_type(spec.datatype), dims=spec.dims)
    # Triton's flag for a model that answers a request with several responses (a stream).
    config.model_transaction_policy.decoupled = cfg.generation is not None
    config.dynamic_batching.max_queue_delay_microseconds = int(cfg.max_batch_wait_ms * 1000)
    config.dynamic_batching.priority_levels = cfg.priority_levels
    config.dynamic_batching.default_priority_level = cfg.default_priority
    config.response_cache.enable = cfg.response_cache.enabled
    # The request limits the gateway checks beyond the tensors' specs (requests.py).
    if cfg.tokenize is not None:
        config.parameters["max_text_bytes"].string_value = str(cfg.tokenize.max_text_bytes)
    if cfg.max_sequence:
        config.parameters["max_sequence"].string_value = str(cfg.max_sequence)
    # The execution providers each tier's config asks its workers for (JSON: tier -> names
    # in order). What the live workers' sessions got (a worker's own setting wins, CPU may
    # be a fallback) is `execution_providers_live` (gateway/live_providers.py) and the
    # workers' metric tiermesh_worker_session_info.
    asked = {t.name: [p.name for p in t.execution_providers] for t in cfg.tiers}
    if any(asked.values()):
        config.parameters[EXECUTION_PROVIDERS].string_value = json.dumps(
            {tier: names for tier, names in asked.items() if names}, separators=(",", ":")
        )
    return service_pb2.ModelConfigResponse(config=config)
