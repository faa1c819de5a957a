"""The REST door's pure parts: HTTP codes of the gRPC table, JSON and binary-data bodies,
Triton statistics from answer timelines, and who may use model control."""

from __future__ import annotations

import json
import struct

import grpc
import numpy as np
import pytest

from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.tenants import Tenant
from tiermesh.core.tensors import TensorData
from tiermesh.gateway.control import check_allowed
from tiermesh.gateway.rest_codec import (
    MAX_JSON_BYTES,
    MAX_JSON_VALUES,
    OutputChoice,
    http_status,
    infer_body,
    parse_infer,
    retry_after_s,
)
from tiermesh.gateway.statistics import InferenceStatistics, model_stats_doc, stage_ns


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400),
        (grpc.StatusCode.NOT_FOUND, 404),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
        (grpc.StatusCode.UNAVAILABLE, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
        (grpc.StatusCode.UNAUTHENTICATED, 401),
        (grpc.StatusCode.PERMISSION_DENIED, 403),
        (grpc.StatusCode.INTERNAL, 500),
        (grpc.StatusCode.ABORTED, 409),
        (grpc.StatusCode.DATA_LOSS, 500),
    ],
)
def test_http_status_follows_the_grpc_table(code: grpc.StatusCode, status: int) -> None:
    assert http_status(code) == status


def test_retry_after_is_whole_seconds_rounded_up() -> None:
    assert [retry_after_s(ms) for ms in (0, 100, 1000, 1001)] == [1, 1, 1, 2]


def _doc(**override: object) -> dict[str, object]:
    inp: dict[str, object] = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 2]}
    inp["data"] = [[1, 2]]
    inp.update(override)
    return {"id": "r1", "inputs": [inp], "parameters": {"priority": 1, "timeout": 5}}


def test_json_inputs_become_raw_little_endian_tensors() -> None:
    req, choice = parse_infer(json.dumps(_doc()).encode(), None, "simple", "")
    assert req.inputs == (TensorData("INPUT0", "INT32", (1, 2), np.array([1, 2], "<i4").tobytes()),)
    assert (req.client_request_id, req.priority, req.timeout_us) == ("r1", 1, 5)
    assert choice == OutputChoice()


def test_binary_inputs_follow_the_json_header() -> None:
    doc = {
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
            {"name": "S", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}},
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(doc).encode()
    blob = np.array([1.5, 2.5], "<f4").tobytes() + struct.pack("<I", 2) + b"hi"
    req, choice = parse_infer(head + blob, len(head), "m", "1")
    assert req.inputs[0].raw == blob[:8] and req.inputs[1].raw == blob[8:]
    assert choice.is_binary("anything")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"inputs": [', "malformed JSON in the request body"),
        (b"[1]", "must be a JSON object"),
        (json.dumps(_doc(datatype="INT33")).encode(), "unknown datatype"),
        (json.dumps(_doc(data=[1.5, 2])).encode(), "is not of datatype INT32"),
        (json.dumps(_doc(data=[True, 2])).encode(), "is not of datatype INT32"),
        (json.dumps(_doc(data=[1, 2, 3])).encode(), "more than 2 values in 'data'"),
        (json.dumps(_doc(data=[1, 2**40])).encode(), "does not fit INT32"),
        (json.dumps(_doc(shape="x")).encode(), "'shape' must be a list of integers"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"inputs": [' + b"9" * 5000 + b"]}", "malformed JSON"),
        (b" " * (MAX_JSON_BYTES + 1), "send large tensors as binary data"),
        (json.dumps(_doc(data=[0] * MAX_JSON_VALUES)).encode(), "values (commas), over the limit"),
        (json.dumps(_doc(shape=[1, 2_000_000])).encode(), "over the limit of"),
    ],
)
def test_bad_bodies_are_invalid_argument_naming_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(MeshError) as err:
        parse_infer(body, None, "simple", "")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.message


def test_the_screen_sees_each_input_before_its_data_is_read() -> None:
    seen: list[tuple[str, str, tuple[int, ...]]] = []

    def screen(name: str, datatype: str, shape: tuple[int, ...]) -> None:
        seen.append((name, datatype, shape))
        raise MeshError(grpc.StatusCode.INVALID_ARGUMENT, "refused by the screen")

    # 2**40 does not fit INT32: had the data been read, that would be the error.
    body = json.dumps(_doc(data=[1, 2**40])).encode()
    with pytest.raises(MeshError) as err:
        parse_infer(body, None, "simple", "", screen)
    assert err.value.message == "refused by the screen"
    assert seen == [("INPUT0", "INT32", (1, 2))]


def test_binary_sizes_must_account_for_every_byte() -> None:
    tensor = {"name": "A", "datatype": "INT8", "shape": [2], "parameters": {"binary_data_size": 2}}
    doc = {"inputs": [tensor]}
    head = json.dumps(doc).encode()
    with pytest.raises(MeshError, match="after the last input"):
        parse_infer(head + b"\x01\x02\x03", len(head), "m", "")
    with pytest.raises(MeshError, match="goes past"):
        parse_infer(head + b"\x01", len(head), "m", "")
    with pytest.raises(MeshError, match="does not fit"):
        parse_infer(head, len(head) + 5, "m", "")


def _result() -> JobResult:
    timing = Timing(
        received_ns=1_000,
        enqueued_ns=2_000,
        dequeued_ns=3_500,
        batch_start_ns=4_000,
        batch_end_ns=9_000,
        postprocessed_ns=9_500,
        delivered_ns=9_800,
    )
    out = TensorData("OUTPUT0", "INT32", (1, 2), np.array([3, 4], "<i4").tobytes())
    return JobResult(
        "rid", "simple", "gw", outputs=(out,), version="1", timing=timing, worker="w", batch_size=2
    )


def test_outputs_as_json_or_binary() -> None:
    body, length = infer_body(_result(), 10_000, False, OutputChoice())
    doc = json.loads(body)
    assert length is None and doc["outputs"][0]["data"] == [3, 4]
    assert doc["parameters"]["tiermesh.compute_ms"] == 0.005
    body, length = infer_body(_result(), 10_000, False, OutputChoice(binary=frozenset({"OUTPUT0"})))
    assert length is not None and body[length:] == np.array([3, 4], "<i4").tobytes()
    assert json.loads(body[:length])["outputs"][0]["parameters"] == {"binary_data_size": 8}


def test_statistics_map_the_timeline_onto_tritons_fields() -> None:
    result = _result()
    ns = stage_ns(result.timing, 10_000)
    breakdown = result.timing.breakdown_ms(10_000)
    assert ns.queue / 1e6 == pytest.approx(breakdown["queue_ms"] + breakdown["batch_wait_ms"])
    assert ns.compute_input / 1e6 == pytest.approx(breakdown["preprocess_ms"])
    assert ns.compute_output / 1e6 == pytest.approx(breakdown["postprocess_ms"])
    stats = InferenceStatistics()
    for _ in range(2):  # two requests of one batch: one execution
        stats.computed("simple", "1", 1, result.timing, 10_000, ("w", 4_000), 2)
    stats.failed("simple", "1", 0, 700)
    doc = model_stats_doc("simple", "1", stats.of("simple", "1"))
    assert doc["inference_count"] == 2 and doc["execution_count"] == 1
    inference = doc["inference_stats"]
    assert inference["success"] == {"count": 2, "ns": 18_000}  # type: ignore[index]
    assert inference["compute_infer"] == {"count": 2, "ns": 10_000}  # type: ignore[index]
    assert inference["fail"] == {"count": 1, "ns": 700}  # type: ignore[index]


def _tenant(admin: bool) -> Tenant:
    return Tenant("t", (), None, 1.0, 1, 1, admin=admin)


def test_model_control_needs_the_mode_and_an_admin_tenant() -> None:
    check_allowed(True, True, _tenant(admin=True))
    for enabled, auth_on, tenant in [
        (False, False, None),
        (True, False, None),  # a port without API keys: nobody is an admin there
        (True, True, _tenant(admin=False)),
    ]:
        with pytest.raises(MeshError) as err:
            check_allowed(enabled, auth_on, tenant)
        assert err.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_generation_parameters_come_through_the_rest_door() -> None:
    doc = {
        "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}],
        "parameters": {"max_new_tokens": 5, "temperature": 0.5, "stop": ["a", "b"], "x": 1},
    }
    req, _ = parse_infer(json.dumps(doc).encode(), None, "smollm2", "")
    assert req.parameters == {"max_new_tokens": 5, "temperature": 0.5, "stop": ["a", "b"]}
