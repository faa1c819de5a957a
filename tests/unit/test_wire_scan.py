"""What a ModelInferRequest lists, counted from its bytes before protobuf parses it."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from tests.protowire import varint
from tiermesh.core.validation import MAX_LISTED_ELEMENTS
from tiermesh.gateway import wire_scan
from tiermesh.gateway.converters import MAX_INPUTS, MAX_RANK
from tiermesh.gateway.wire_scan import MAX_FRAMED_ELEMENTS


def _refused(data: bytes) -> str:
    err = wire_scan.check(data)
    assert err is not None and err.code == grpc.StatusCode.INVALID_ARGUMENT
    return err.message


def _typed(field: str, values: list[object], shape: list[int]) -> bytes:
    msg = service_pb2.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="A", datatype="INT64", shape=shape)
    getattr(t.contents, field).extend(values)
    return msg.SerializeToString()


def test_what_clients_send_passes() -> None:
    x = triton.InferInput("X", [2, 3], "FP32")
    x.set_data_from_numpy(np.ones((2, 3), np.float32))
    t = triton.InferInput("TEXT", [2], "BYTES")
    t.set_data_from_numpy(np.array([b"a", b"b"], dtype=object))
    raw = _get_inference_request("m", [x, t], "1", "id", None, 0, False, False, 0, None, None)
    assert wire_scan.check(raw.SerializeToString()) is None
    at_limit = _typed("int64_contents", [0] * MAX_LISTED_ELEMENTS, [MAX_LISTED_ELEMENTS])
    assert wire_scan.check(at_limit) is None
    framed = _typed("bytes_contents", [b""] * MAX_FRAMED_ELEMENTS, [MAX_FRAMED_ELEMENTS])
    assert wire_scan.check(framed) is None


@pytest.mark.parametrize(
    ("field", "values"),
    [
        ("int_contents", [0] * (MAX_LISTED_ELEMENTS + 1)),
        ("fp64_contents", [0.0] * (MAX_LISTED_ELEMENTS + 1)),
        ("bool_contents", [False] * (MAX_LISTED_ELEMENTS + 1)),
        ("bytes_contents", [b""] * (MAX_FRAMED_ELEMENTS + 1)),
    ],
)
def test_contents_past_the_limits_are_refused_from_their_bytes(
    field: str, values: list[object]
) -> None:
    # The shape says 1: the element count is what gives them away, before any parse.
    assert "send large tensors as raw_input_contents" in _refused(_typed(field, values, [1]))


def test_the_limit_is_for_all_inputs_together() -> None:
    msg = service_pb2.ModelInferRequest(model_name="m")
    for name in ("A", "B"):
        t = msg.inputs.add(name=name, datatype="INT64", shape=[1])
        t.contents.int64_contents.extend([0] * (MAX_LISTED_ELEMENTS // 2 + 1))
    assert "send large tensors as raw_input_contents" in _refused(msg.SerializeToString())


def test_scalars_sent_unpacked_are_counted_one_by_one() -> None:
    unpacked = b"\x10\x00" * (MAX_FRAMED_ELEMENTS + 1)  # int_contents, one field each
    tensor = b"\x0a\x01A" + b"\x2a" + varint(len(unpacked)) + unpacked
    data = b"\x0a\x01m" + b"\x2a" + varint(len(tensor)) + tensor
    assert service_pb2.ModelInferRequest.FromString(data).inputs[0].contents.int_contents
    assert "framed one by one" in _refused(data)


def test_many_one_element_packed_fields_stop_the_walk() -> None:
    # protobuf appends each packed field's elements: 1 M fields of one bool each parse as a
    # million bools. Each field counts as framed, so the walk stops after 64 Ki of them
    # (walking all of them took 5.7 s on the gateway's loop).
    packed = b"\x0a\x01\x00" * (MAX_FRAMED_ELEMENTS + 1)  # bool_contents, packed, 1 each
    tensor = b"\x0a\x01A" + b"\x2a" + varint(len(packed)) + packed
    data = b"\x0a\x01m" + b"\x2a" + varint(len(tensor)) + tensor
    contents = service_pb2.ModelInferRequest.FromString(data).inputs[0].contents
    assert len(contents.bool_contents) == MAX_FRAMED_ELEMENTS + 1
    assert "framed one by one" in _refused(data)


# Bytes that make a request large enough to be walked (a small one is not: it cannot list
# many elements, and the parsed checks refuse its rank or inputs).
PADDING = b"\x3a" + varint(MAX_FRAMED_ELEMENTS) + bytes(MAX_FRAMED_ELEMENTS)  # raw contents


def test_rank_and_inputs_past_their_limits() -> None:
    deep = _typed("int64_contents", [0], [1] * 33)
    assert f"rank {MAX_RANK + 1} over" in _refused(deep + PADDING)
    msg = service_pb2.ModelInferRequest(model_name="m")
    for i in range(MAX_INPUTS + 1):
        msg.inputs.add(name=f"X{i}")
    assert f"{MAX_INPUTS + 1} inputs" in _refused(msg.SerializeToString() + PADDING)
    assert wire_scan.check(deep) is None  # small: left to the checks after the parse


def test_bytes_that_do_not_frame_are_left_to_the_parser() -> None:
    for data in (b"\xff\xff\xff\xff", b"\x2a\x10\x0a", b"\x0f", b""):
        assert wire_scan.check(data) is None
