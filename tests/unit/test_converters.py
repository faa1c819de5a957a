"""KServe v2 protobuf messages (as tritonclient ships them) <-> gateway domain types."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.grpc._utils import _get_inference_request

from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import from_numpy, join_bytes, to_numpy
from tiermesh.core.validation import MAX_LISTED_ELEMENTS
from tiermesh.gateway.converters import (
    MAX_INPUTS,
    MAX_RANK,
    infer_request,
    infer_response,
    model_config,
    model_metadata,
)
from tiermesh.gateway.decoding import UNDECODABLE_MESSAGE, add_inference_servicer
from tiermesh.gateway.requests import validate


def _cfg(**over: Any) -> ModelConfig:
    raw: dict[str, Any] = {
        "name": "mix",
        "max_batch_size": 16,
        "inputs": [
            {"name": "X", "datatype": "FP32", "dims": [3]},
            {"name": "TEXT", "datatype": "BYTES", "dims": [-1]},
        ],
        "outputs": [{"name": "Y", "datatype": "FP32", "dims": [2]}],
        "batching": {"max_batch_wait_ms": 2.5},
        "priority_levels": 3,
        "default_priority": 2,
        "versions": {"1": {"model.onnx": "0" * 64}, "3": {"model.onnx": "1" * 64}},
        **over,
    }
    return parse_config(raw, "test")


def _invalid(msg: service_pb2.ModelInferRequest) -> str:
    with pytest.raises(MeshError) as exc:
        infer_request(msg)
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return exc.value.message


# -- infer_request -------------------------------------------------------------------------


def test_infer_request_from_raw_contents() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    msg = service_pb2.ModelInferRequest(model_name="mix", model_version="1", id="abc")
    msg.inputs.add(name="X", datatype="FP32", shape=[2, 3])
    msg.inputs.add(name="TEXT", datatype="BYTES", shape=[2, 1])
    msg.raw_input_contents.extend([x.tobytes(), join_bytes([b"hi", "é".encode()])])
    msg.outputs.add(name="Y")
    req = infer_request(msg)
    assert (req.model, req.version, req.client_request_id) == ("mix", "1", "abc")
    assert req.requested_outputs == ("Y",)
    assert req.priority == 0
    assert req.timeout_us is None
    assert [t.name for t in req.inputs] == ["X", "TEXT"]
    assert req.inputs[0].shape == (2, 3)
    np.testing.assert_array_equal(to_numpy(req.inputs[0]), x)
    assert to_numpy(req.inputs[1]).tolist() == [["hi"], ["é"]]
    validate(_cfg(), req)


@pytest.mark.parametrize(
    ("datatype", "field", "values", "dtype"),
    [
        ("FP32", "fp32_contents", [1.5, -2.0, 0.25, 8.0], np.float32),
        ("INT64", "int64_contents", [2**40, -3, 0, 7], np.int64),
        ("INT32", "int_contents", [1, -2, 3, -4], np.int32),
        ("BOOL", "bool_contents", [True, False, False, True], np.bool_),
    ],
)
def test_infer_request_from_typed_contents(
    datatype: str, field: str, values: list[Any], dtype: type
) -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="A", datatype=datatype, shape=[2, 2])
    getattr(t.contents, field).extend(values)
    (got,) = infer_request(msg).inputs
    assert got.raw == np.array(values, dtype=dtype).tobytes()
    np.testing.assert_array_equal(to_numpy(got), np.array(values, dtype=dtype).reshape(2, 2))


def test_infer_request_from_bytes_contents() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 3])
    t.contents.bytes_contents.extend([b"a", b"", "日本".encode()])
    (got,) = infer_request(msg).inputs
    assert got.raw == join_bytes([b"a", b"", "日本".encode()])
    assert to_numpy(got).tolist() == [["a", "", "日本"]]


def test_typed_contents_value_out_of_range() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="A", datatype="INT8", shape=[1])
    t.contents.int_contents.append(300)
    assert "does not fit INT8" in _invalid(msg)


def test_typed_contents_whose_count_is_not_the_shapes_are_refused_unread() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="A", datatype="INT32", shape=[2])
    t.contents.int_contents.extend([0] * 5)
    assert "contents hold 5 elements, shape [2] needs 2" in _invalid(msg)


def test_typed_contents_past_the_listed_limit_must_be_raw() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="A", datatype="BOOL", shape=[MAX_LISTED_ELEMENTS + 1])
    t.contents.bool_contents.extend([False] * (MAX_LISTED_ELEMENTS + 1))
    assert "send larger tensors as raw_input_contents" in _invalid(msg)


def test_the_screen_sees_each_input_before_its_contents_are_read() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    seen: list[tuple[str, str, tuple[int, ...]]] = []

    def screen(name: str, datatype: str, shape: tuple[int, ...]) -> None:
        seen.append((name, datatype, shape))
        raise MeshError(grpc.StatusCode.INVALID_ARGUMENT, "refused by the screen")

    with pytest.raises(MeshError) as exc:
        infer_request(msg, screen)
    # The value 300 does not fit INT8: had the contents been read, that would be the error.
    assert exc.value.message == "refused by the screen"
    assert seen == [("A", "INT8", (1,))]


def test_fp16_must_be_raw() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="H", datatype="FP16", shape=[1])
    assert "must be sent as raw contents" in _invalid(msg)


def test_raw_contents_count_mismatch() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="FP32", shape=[1])
    msg.inputs.add(name="B", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(bytes(4))
    assert "raw_input_contents has 1 entries for 2 inputs" in _invalid(msg)


@pytest.mark.parametrize("kind", ["uint64_param", "int64_param"])
def test_priority_and_timeout_parameters(kind: str) -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    setattr(msg.parameters["priority"], kind, 3)
    setattr(msg.parameters["timeout"], kind, 250_000)
    req = infer_request(msg)
    assert req.priority == 3
    assert req.timeout_us == 250_000


def test_sticky_key_and_version_reach_the_request() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m", model_version="2")
    msg.parameters["sticky_key"].string_param = "user-42"
    req = infer_request(msg)
    assert (req.controls.sticky_key, req.version) == ("user-42", "2")
    msg.parameters["sticky_key"].int64_param = 42
    assert "parameter 'sticky_key' must be a string" in _invalid(msg)


@pytest.mark.parametrize(
    ("key", "kind", "value"),
    [("timeout", "string_param", "100"), ("priority", "double_param", 1.0)],
)
def test_non_integer_parameter_invalid(key: str, kind: str, value: Any) -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    setattr(msg.parameters[key], kind, value)
    msg_text = _invalid(msg)
    assert f"parameter '{key}' must be an integer" in msg_text
    assert kind in msg_text


# -- what tritonclient really sends --------------------------------------------------------


def test_tritonclient_request_round_trips() -> None:
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    text = np.array([["héllo"], ["🎉 wörld"]], dtype=object)
    inputs = [triton.InferInput("X", [2, 3], "FP32"), triton.InferInput("TEXT", [2, 1], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(text)
    msg = _get_inference_request(
        model_name="mix",
        inputs=inputs,
        model_version="1",
        request_id="rid-1",
        outputs=[triton.InferRequestedOutput("Y")],
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=1,
        timeout=5_000,
        parameters=None,
    )
    # Through the wire format, as the gateway would receive it.
    req = infer_request(service_pb2.ModelInferRequest.FromString(msg.SerializeToString()))
    assert (req.model, req.version, req.client_request_id) == ("mix", "1", "rid-1")
    assert (req.priority, req.timeout_us) == (1, 5_000)
    assert req.requested_outputs == ("Y",)
    validate(_cfg(), req)
    np.testing.assert_array_equal(to_numpy(req.inputs[0]), x)
    assert to_numpy(req.inputs[1]).tolist() == text.tolist()


def test_tritonclient_without_priority_or_timeout() -> None:
    inp = triton.InferInput("X", [1, 3], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3), np.float32))
    msg = _get_inference_request("mix", [inp], "", "", None, 0, False, False, 0, None, None)
    req = infer_request(msg)
    assert (req.priority, req.timeout_us, req.version) == (0, None, "")


# -- responses and metadata ----------------------------------------------------------------


def test_infer_response_outputs_and_timing() -> None:
    y = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    result = JobResult(
        request_id="r",
        model="mix",
        gateway="g",
        version="1",
        client_request_id="cid",
        tier="edge",
        batch_size=7,
        outputs=(from_numpy("Y", y, "FP32"), from_numpy("L", np.array(["a"], object), "BYTES")),
        timing=Timing(received_ns=1_000, enqueued_ns=11_000, dequeued_ns=111_000),
    )
    resp = infer_response(result, responded_ns=2_001_000)
    assert (resp.model_name, resp.model_version, resp.id) == ("mix", "1", "cid")
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("Y", "FP32", [2, 2]),
        ("L", "BYTES", [1]),
    ]
    assert resp.raw_output_contents[0] == y.tobytes()
    assert resp.raw_output_contents[1] == join_bytes([b"a"])
    assert resp.parameters["tiermesh.preprocess_ms"].double_param == 0.01
    assert resp.parameters["tiermesh.queue_ms"].double_param == 0.1
    assert resp.parameters["tiermesh.total_ms"].double_param == 2.0
    assert "tiermesh.compute_ms" not in resp.parameters  # not reached
    assert resp.parameters["tiermesh.tier"].string_param == "edge"
    assert resp.parameters["tiermesh.batch_size"].int64_param == 7
    # tritonclient reads it back.
    got = triton.InferResult(resp)
    np.testing.assert_array_equal(got.as_numpy("Y"), y)
    assert got.as_numpy("L").tolist() == [b"a"]


def test_model_metadata_has_dynamic_batch_dim() -> None:
    resp = model_metadata(_cfg())
    assert resp.name == "mix"
    assert list(resp.versions) == ["1", "3"]
    assert resp.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in resp.inputs] == [
        ("X", "FP32", [-1, 3]),
        ("TEXT", "BYTES", [-1, -1]),
    ]
    assert [list(t.shape) for t in resp.outputs] == [[-1, 2]]


def test_model_metadata_without_batching_keeps_dims() -> None:
    resp = model_metadata(_cfg(max_batch_size=0))
    assert list(resp.inputs[0].shape) == [3]


def test_model_config_types_and_dynamic_batching() -> None:
    config = model_config(_cfg()).config
    assert config.name == "mix"
    assert config.max_batch_size == 16
    assert config.input[0].data_type == model_config_pb2.TYPE_FP32
    assert config.input[1].data_type == model_config_pb2.TYPE_STRING
    assert list(config.input[0].dims) == [3]
    assert list(config.input[1].dims) == [-1]
    assert config.output[0].data_type == model_config_pb2.TYPE_FP32
    assert config.HasField("dynamic_batching")
    assert config.dynamic_batching.max_queue_delay_microseconds == 2500
    assert config.dynamic_batching.priority_levels == 3
    assert config.dynamic_batching.default_priority_level == 2


def test_model_config_says_what_a_front_door_must_check() -> None:
    """The Go front door takes a request itself only from what ModelConfig tells it: the
    response cache, the text size limit and the longest sequence (else it passes it on)."""
    plain = model_config(_cfg()).config
    assert not plain.response_cache.enable and dict(plain.parameters) == {}
    config = model_config(
        _cfg(
            tokenize={"tokenizer": "tokenizer.json", "max_length": 64, "max_text_bytes": 900},
            response_cache={"enabled": True, "ttl_s": 1.0, "max_entries": 3},
        )
    ).config
    assert config.response_cache.enable
    assert {k: v.string_value for k, v in config.parameters.items()} == {
        "max_text_bytes": "900",
        "max_sequence": "64",
    }


@pytest.mark.parametrize("datatype", ["BOOL", "UINT8", "INT16", "INT64", "FP16", "FP64", "UINT64"])
def test_model_config_maps_every_fixed_type(datatype: str) -> None:
    cfg = _cfg(outputs=[{"name": "Y", "datatype": datatype, "dims": [1]}])
    config = model_config(cfg).config
    assert model_config_pb2.DataType.Name(config.output[0].data_type) == f"TYPE_{datatype}"


# -- hostile input (bugs the hostile e2e run found) -----------------------------------------


@pytest.mark.parametrize("field", ["fp32_contents", "bytes_contents", "int_contents"])
def test_contents_beside_raw_contents_is_invalid(field: str) -> None:
    """Which would the caller mean? The typed contents were silently ignored before."""
    msg = service_pb2.ModelInferRequest(model_name="mix")
    msg.inputs.add(name="X", datatype="FP32", shape=[1, 3])
    msg.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    getattr(msg.inputs[0].contents, field).append(b"1" if field == "bytes_contents" else 1)
    assert "contents given beside raw_input_contents" in _invalid(msg)


def test_an_empty_contents_message_beside_raw_is_fine() -> None:
    msg = service_pb2.ModelInferRequest(model_name="mix")
    msg.inputs.add(name="X", datatype="FP32", shape=[1, 3])
    msg.inputs[0].contents.SetInParent()
    msg.raw_input_contents.append(np.zeros(3, np.float32).tobytes())
    assert infer_request(msg).inputs[0].raw == bytes(12)


def test_rank_and_input_count_limits() -> None:
    msg = service_pb2.ModelInferRequest(model_name="mix")
    msg.inputs.add(name="X", datatype="FP32", shape=[1] * (MAX_RANK + 1))
    assert f"rank {MAX_RANK + 1} over the limit" in _invalid(msg)
    msg = service_pb2.ModelInferRequest(model_name="mix")
    for i in range(MAX_INPUTS + 1):
        msg.inputs.add(name=f"X{i}", datatype="FP32", shape=[1])
    assert f"{MAX_INPUTS + 1} inputs, over the limit" in _invalid(msg)


# -- requests that do not parse ------------------------------------------------------------


class _Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):  # type: ignore[no-untyped-def]
        return service_pb2.ModelInferResponse(model_name=request.model_name)


@pytest.mark.parametrize(
    "payload",
    [
        b"\xff\xff\xff\xff",  # not protobuf
        b"\x0a\x03\xff\xfe\x00",  # model_name (field 1) that is not UTF-8
        b"\x2a\x03\x0a\x01\xff",  # inputs[0].name that is not UTF-8
        service_pb2.ModelInferRequest(model_name="m").SerializeToString()[:-1],  # cut short
    ],
)
async def test_unparseable_request_is_invalid_argument(payload: bytes) -> None:
    """grpc itself answers UNKNOWN, with the parser's exception type in the details."""
    server = grpc.aio.server()
    add_inference_servicer(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await call(payload, timeout=10)
            assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert exc.value.details() == UNDECODABLE_MESSAGE
            # A well-formed request still reaches the servicer, on the same server.
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = await stub.ModelInfer(service_pb2.ModelInferRequest(model_name="ok"))
            assert reply.model_name == "ok"
    finally:
        await server.stop(None)
