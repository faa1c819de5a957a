"""Gateway decisions for text models: byte limits, sequence limits, variants, and the
request/response parameters that carry them."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import companions
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import TensorData, from_numpy, join_bytes
from tiermesh.gateway.converters import infer_request, infer_response
from tiermesh.gateway.requests import InferRequest, validate, variant_of

IDS = [
    {"name": "input_ids", "datatype": "INT64", "dims": [-1]},
    {"name": "attention_mask", "datatype": "INT64", "dims": [-1]},
]
RAW: dict[str, Any] = {
    "name": "txt",
    "max_batch_size": 4,
    "inputs": [{"name": "text", "datatype": "BYTES", "dims": [1]}],
    "outputs": [{"name": "emb", "datatype": "FP32", "dims": [4]}],
    "compute": {
        "inputs": IDS,
        "outputs": [{"name": "hidden", "datatype": "FP32", "dims": [-1, 4]}],
        "pad": {"input_ids": 0, "attention_mask": 0},
    },
    "tokenize": {"tokenizer": "tokenizer.json", "max_length": 8, "max_text_bytes": 10},
    "pool": {"source": "hidden", "mask": "attention_mask", "output": "emb"},
    "companions": [{"name": "txt-ids", "inputs": IDS}],
    "variants": {"fp32": "model.onnx", "int8": "model.int8.onnx", "fp16": "model.fp16.onnx"},
    "default_variant": "fp32",
    "versions": {
        "1": {"model.onnx": "0" * 64, "model.int8.onnx": "1" * 64, "model.fp16.onnx": "2" * 64}
    },
}


@pytest.fixture
def text_cfg() -> ModelConfig:
    return parse_config(copy.deepcopy(RAW), "test")


@pytest.fixture
def ids_cfg(text_cfg: ModelConfig) -> ModelConfig:
    (cfg,) = companions(RAW, text_cfg, "test")
    return cfg


def _text(*items: bytes) -> TensorData:
    return TensorData("text", "BYTES", (len(items), 1), join_bytes(list(items)))


def _ids(length: int, rows: int = 1) -> tuple[TensorData, TensorData]:
    ones = np.ones((rows, length), dtype=np.int64)
    return from_numpy("input_ids", ones, "INT64"), from_numpy("attention_mask", ones, "INT64")


def _invalid(cfg: ModelConfig, *inputs: TensorData) -> str:
    with pytest.raises(MeshError) as exc:
        validate(cfg, InferRequest(cfg.name, "", inputs))
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return exc.value.message


# -- validate: text ------------------------------------------------------------------------


def test_text_over_the_byte_limit(text_cfg: ModelConfig) -> None:
    message = _invalid(text_cfg, _text(b"short", b"x" * 11))
    assert "input 'text'" in message
    assert "text element 1 is 11 bytes" in message
    assert "limit of 10" in message


def test_text_limit_counts_utf8_bytes(text_cfg: ModelConfig) -> None:
    # Four characters, twelve bytes.
    message = _invalid(text_cfg, _text("€€€€".encode()))
    assert "text element 0 is 12 bytes" in message


@pytest.mark.parametrize("items", [[b"x" * 10], [b"", b"0123456789"], ["é" * 5]])
def test_text_at_the_limit_passes(text_cfg: ModelConfig, items: list[Any]) -> None:
    raw = [i.encode() if isinstance(i, str) else i for i in items]
    validate(text_cfg, InferRequest("txt", "", (_text(*raw),)))


def test_text_model_has_no_sequence_limit_on_text(text_cfg: ModelConfig) -> None:
    # max_sequence applies to dynamic dims; text is [N, 1] and long texts are truncated.
    assert text_cfg.max_sequence == 8
    validate(text_cfg, InferRequest("txt", "", (_text(*[b"a"] * 4),)))


# -- validate: companion (token ids) -------------------------------------------------------


def test_companion_inherits_max_sequence(ids_cfg: ModelConfig) -> None:
    assert (ids_cfg.max_sequence, ids_cfg.tokenize, ids_cfg.queue_model) == (8, None, "txt")


@pytest.mark.parametrize("rows", [1, 4])
def test_sequence_at_the_limit_passes(ids_cfg: ModelConfig, rows: int) -> None:
    validate(ids_cfg, InferRequest("txt-ids", "", _ids(8, rows)))


def test_sequence_over_the_limit(ids_cfg: ModelConfig) -> None:
    message = _invalid(ids_cfg, *_ids(9))
    assert "input 'input_ids'" in message
    assert "dimension 1 is 9" in message
    assert "longer than the model's 8" in message


def test_sequence_limit_for_model_without_batching() -> None:
    raw = copy.deepcopy(RAW) | {"max_batch_size": 0, "inputs": [{**IDS[0], "dims": [-1, -1]}]}
    raw["compute"]["inputs"] = [{**IDS[0], "dims": [-1, -1]}]
    raw["compute"]["pad"] = {"input_ids": 0}
    raw["pool"] = raw["companions"] = None
    cfg = parse_config(raw, "test")
    assert cfg.max_sequence == 8
    too_long = from_numpy("input_ids", np.ones((9, 8), np.int64), "INT64")
    assert "dimension 0 is 9, longer than the model's 8" in _invalid(cfg, too_long)
    at_limit = from_numpy("input_ids", np.ones((8, 8), np.int64), "INT64")
    validate(cfg, InferRequest("txt", "", (at_limit,)))


# -- variant_of ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requested", "chosen"), [("", "fp32"), ("fp32", "fp32"), ("int8", "int8")]
)
def test_variant_of(text_cfg: ModelConfig, requested: str, chosen: str) -> None:
    gated = replace(text_cfg, servable={"1": frozenset({"fp32", "int8"})})
    assert variant_of(gated, requested) == chosen


def test_a_variant_without_a_passing_gate_record_is_refused(text_cfg: ModelConfig) -> None:
    with pytest.raises(MeshError) as exc:
        variant_of(text_cfg, "int8")
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert exc.value.message.startswith(
        "variant 'int8' of model 'txt' version 1 has no passing accuracy-gate record"
    )
    assert exc.value.message.endswith("variants that serve: fp32)")
    # In a version where it passed, it serves; `ungated: true` serves it everywhere.
    raw = copy.deepcopy(RAW)
    raw["versions"]["2"] = raw["versions"]["1"]
    two = replace(
        parse_config(raw, "test"), servable={"1": frozenset({"fp32"}), "2": frozenset({"int8"})}
    )
    assert variant_of(two, "int8", "2") == "int8"
    with pytest.raises(MeshError):
        variant_of(two, "int8", "1")
    assert variant_of(replace(text_cfg, ungated=True), "int8") == "int8"


def test_variant_of_default_is_configurable() -> None:
    cfg = parse_config(copy.deepcopy(RAW) | {"default_variant": "int8"}, "test")
    assert variant_of(cfg, "") == "int8"


@pytest.mark.parametrize("requested", ["int4", "FP32", "model.onnx"])
def test_unknown_variant(text_cfg: ModelConfig, requested: str) -> None:
    with pytest.raises(MeshError) as exc:
        variant_of(text_cfg, requested)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"model 'txt' has no variant '{requested}'" in exc.value.message
    assert "(variants: fp16, fp32, int8)" in exc.value.message


# -- converters: the variant parameter and the response parameters -------------------------


@pytest.mark.parametrize("variant", ["int8", ""])
def test_variant_parameter_read(variant: str) -> None:
    msg = service_pb2.ModelInferRequest(model_name="txt")
    msg.parameters["variant"].string_param = variant
    assert infer_request(msg).variant == variant


def test_variant_parameter_absent() -> None:
    assert infer_request(service_pb2.ModelInferRequest(model_name="txt")).variant == ""


def test_variant_parameter_from_tritonclient() -> None:
    inp = triton.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"hello"]], dtype=object))
    msg = _get_inference_request(
        "txt", [inp], "", "", None, 0, False, False, 0, None, {"variant": "int8"}
    )
    req = infer_request(service_pb2.ModelInferRequest.FromString(msg.SerializeToString()))
    assert req.variant == "int8"


@pytest.mark.parametrize(
    ("kind", "value"), [("int64_param", 8), ("bool_param", True), ("double_param", 1.5)]
)
def test_non_string_variant_parameter(kind: str, value: Any) -> None:
    msg = service_pb2.ModelInferRequest(model_name="txt")
    setattr(msg.parameters["variant"], kind, value)
    with pytest.raises(MeshError) as exc:
        infer_request(msg)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "parameter 'variant' must be a string" in exc.value.message


def _result(**fields: Any) -> JobResult:
    return JobResult(request_id="r", model="txt", gateway="g", version="1", **fields)


@pytest.mark.parametrize(("annotation", "flag"), [("true", True), ("false", False)])
def test_infer_response_variant_bucket_truncated(annotation: str, flag: bool) -> None:
    resp = infer_response(
        _result(variant="int8", bucket=2, annotations={"truncated": annotation}), 0
    )
    params = resp.parameters
    assert params["tiermesh.variant"].WhichOneof("parameter_choice") == "string_param"
    assert params["tiermesh.variant"].string_param == "int8"
    assert params["tiermesh.bucket"].WhichOneof("parameter_choice") == "int64_param"
    assert params["tiermesh.bucket"].int64_param == 2
    assert params["tiermesh.truncated"].WhichOneof("parameter_choice") == "bool_param"
    assert params["tiermesh.truncated"].bool_param is flag


def test_infer_response_without_variant_or_truncation() -> None:
    resp = infer_response(_result(bucket=0), 0)
    assert "tiermesh.variant" not in resp.parameters
    assert "tiermesh.truncated" not in resp.parameters
    assert resp.parameters["tiermesh.bucket"].int64_param == 0


def test_response_parameters_reach_tritonclient() -> None:
    resp = infer_response(_result(variant="fp16", bucket=3, annotations={"truncated": "true"}), 0)
    got = triton.InferResult(resp).get_response(as_json=True)
    params = got["parameters"]
    assert params["tiermesh.variant"] == {"string_param": "fp16"}
    assert params["tiermesh.bucket"] == {"int64_param": "3"}
    assert params["tiermesh.truncated"] == {"bool_param": True}
