"""bench calls and metrics: reading response parameters, status codes and trailers, and
the queue-depth gauge."""

from __future__ import annotations

import grpc
import pytest
from grpc.aio import Metadata
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import raise_error_grpc
from tritonclient.utils import InferenceServerException

from tiermesh.bench.calls import error_of, read_reply
from tiermesh.bench.metrics import QueueDepthSampler, parse_gauge
from tiermesh.bench.records import CLIENT_ERROR
from tiermesh.core.v2_parameters import set_parameter


def params(**values: object) -> dict[str, service_pb2.InferParameter]:
    """A response's parameters as the mesh names them: `tiermesh.<name>`."""
    resp = service_pb2.ModelInferResponse()
    for key, value in values.items():
        set_parameter(resp.parameters[f"tiermesh.{key}"], value)
    return dict(resp.parameters)


def test_reads_the_contract_parameters() -> None:
    reply = read_reply(
        params(
            queue_ms=1.5,
            preprocess_ms=0.25,
            batch_wait_ms=2.0,
            compute_ms=3.0,
            postprocess_ms=0.5,
            delivery_ms=0.75,
            total_ms=8.0,
            batch_size=4,
            bucket=64,
            tokens=40,
            padded_tokens=52,
            tier="edge",
            variant="int8",
            worker="w-1",
            truncated=False,
        )
    )
    assert reply.stages_ms == {
        "queue": 1.5,
        "preprocess": 0.25,
        "batch_wait": 2.0,
        "compute": 3.0,
        "postprocess": 0.5,
        "delivery": 0.75,
    }
    assert (reply.total_ms, reply.batch_size, reply.bucket) == (8.0, 4, 64)
    assert (reply.tokens, reply.padded_tokens) == (40, 52)
    assert (reply.tier, reply.variant, reply.worker) == ("edge", "int8", "w-1")


def test_only_the_mesh_names_count() -> None:
    """A caller's own parameter (no `tiermesh.` prefix) is not read as the mesh's."""
    resp = service_pb2.ModelInferResponse()
    set_parameter(resp.parameters["queue_ms"], 9.0)
    set_parameter(resp.parameters["tiermesh.compute_ms"], 2.0)
    reply = read_reply(dict(resp.parameters))
    assert reply.stages_ms == {"compute": 2.0}


def test_absent_parameters_stay_absent() -> None:
    reply = read_reply({})
    assert reply.stages_ms == {} and reply.bucket is None and reply.total_ms is None
    assert reply.tier == ""


def test_status_code_and_retry_after_trailer() -> None:
    rpc = grpc.aio.AioRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        Metadata(),
        Metadata(("retry-after-ms", "250")),
        details="queue full",
    )
    try:
        try:
            raise rpc
        except grpc.RpcError as caught:
            raise_error_grpc(caught)  # as tritonclient does: `from None`, inside `except`
    except InferenceServerException as exc:
        assert error_of(exc) == ("RESOURCE_EXHAUSTED", 250.0)
    plain = InferenceServerException("late", status="StatusCode.DEADLINE_EXCEEDED")
    assert error_of(plain) == ("DEADLINE_EXCEEDED", None)
    assert error_of(InferenceServerException("?")) == ("UNKNOWN", None)
    assert error_of(RuntimeError("boom")) == (CLIENT_ERROR, None)


PROMETHEUS = """\
# HELP tiermesh_queue_depth Entries waiting per stream.
# TYPE tiermesh_queue_depth gauge
tiermesh_queue_depth{model="mlp",priority="1"} 3.0
tiermesh_queue_depth{model="mlp",priority="2",note="a } \\"brace\\""} 4
tiermesh_queue_depth_total 100
tiermesh_queue_depth_seconds_bucket{le="1"} 7
other_metric 9
"""


def test_parse_gauge_sums_its_samples_only() -> None:
    assert parse_gauge(PROMETHEUS, "tiermesh_queue_depth") == 7.0
    assert parse_gauge("tiermesh_queue_depth 2 1700000000\n", "tiermesh_queue_depth") == 2.0
    assert parse_gauge(PROMETHEUS, "missing") is None
    assert parse_gauge(PROMETHEUS, "tiermesh_queue_depth", {"priority": "2"}) == 4.0
    assert parse_gauge(PROMETHEUS, "tiermesh_queue_depth", {"model": "echo"}) is None


async def test_sampler_keeps_samples_or_the_first_failure() -> None:
    now = [10.0]
    ok = QueueDepthSampler(
        "u", 0.5, origin=9.0, fetcher=lambda url: PROMETHEUS, clock=lambda: now[0]
    )
    await ok.poll()
    assert ok.samples == [(1.0, 7.0)] and ok.error == ""

    def refuse(url: str) -> str:
        raise OSError("connection refused")

    down = QueueDepthSampler("u", 0.5, origin=0.0, fetcher=refuse)
    await down.poll()
    assert down.samples == [] and "connection refused" in down.error
    empty = QueueDepthSampler("u", 0.5, origin=0.0, fetcher=lambda url: "x 1\n")
    await empty.poll()
    assert "no tiermesh_queue_depth" in empty.error


@pytest.mark.parametrize("code", ["UNAVAILABLE", "INVALID_ARGUMENT", "CANCELLED"])
def test_codes_lose_their_prefix(code: str) -> None:
    exc = InferenceServerException("x", status=f"StatusCode.{code}")
    assert error_of(exc)[0] == code
