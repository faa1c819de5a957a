"""Scheduling end to end: what must not be computed is not, refusals are fast, the response
cache answers repeats without a worker."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, start_up
from tests.e2e.test_requests_e2e import mlp_input, worker_paused
from tests.polling import eventually
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_client import connect

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    mesh = start_up(tmp_path_factory.mktemp("sched"))
    try:
        yield mesh
    finally:
        if mesh.proc.poll() is None:
            mesh.interrupt()


def spans_where(up: UpProcess, **attrs: Any) -> list[dict[str, Any]]:
    return [s for s in up.spans() if all(s["attributes"].get(k) == v for k, v in attrs.items())]


def request_id_of(up: UpProcess, client_request_id: str) -> str:
    gw = eventually(
        lambda: [
            s
            for s in spans_where(up, **{"tiermesh.client_request_id": client_request_id})
            if s["name"] == MODEL_INFER
        ],
        f"the gateway span of {client_request_id}",
    )
    return str(gw[0]["attributes"]["tiermesh.request_id"])


def test_cancelled_request_is_not_computed(up: UpProcess) -> None:
    async def call_then_cancel() -> None:
        client = aioclient.InferenceServerClient(up.url)
        try:
            inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(np.ones((1, 4), np.float32))
            queue = connect(up.redis_url())
            stream = StreamKey(ComputeUnit("mlp", "1", "fp32"), "center", 2, 0).name
            before = await queue.xlen(stream)
            call = asyncio.ensure_future(client.infer("mlp", [inp], request_id="bye"))
            # Cancel once the request sits in its stream (routed, waiting for the worker).
            deadline = time.monotonic() + 20
            while await queue.xlen(stream) <= before:
                assert time.monotonic() < deadline, "the request never reached its stream"
                await asyncio.sleep(0.01)
            await queue.aclose()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
        finally:
            await client.close()

    with worker_paused(up):
        asyncio.run(call_then_cancel())
        request_id = request_id_of(up, "bye")
    eventually(
        lambda: (
            spans_where(up, **{"tiermesh.request_id": request_id})
            and [
                s
                for s in spans_where(up, **{"tiermesh.request_id": request_id})
                if s["name"] == "cancelled"
            ]
        ),
        "the worker to skip the cancelled request",
    )
    names = {s["name"] for s in spans_where(up, **{"tiermesh.request_id": request_id})}
    assert "compute" not in names


def test_expired_request_is_not_computed(up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(up.url)
    with worker_paused(up), pytest.raises(InferenceServerException) as info:
        client.infer(
            "mlp", [mlp_input(np.ones((1, 4), np.float32))], timeout=200_000, request_id="late"
        )
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    request_id = request_id_of(up, "late")
    eventually(
        lambda: [
            s
            for s in spans_where(up, **{"tiermesh.request_id": request_id})
            if s["name"] == "expired"
        ],
        "the worker to drop the expired request",
    )
    names = {s["name"] for s in spans_where(up, **{"tiermesh.request_id": request_id})}
    assert "compute" not in names


def test_full_queue_refusals_are_fast(up: UpProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp_bounded")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    latencies = []
    with grpc.insecure_channel(up.url) as channel, worker_paused(up):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        # Requests that time out while the worker is paused fill the queue (bound 2).
        eventually(
            lambda: _outcome(stub, request) == grpc.StatusCode.RESOURCE_EXHAUSTED,
            "the queue to fill",
        )
        for _ in range(200):
            started = time.perf_counter()
            code = _outcome(stub, request)
            latencies.append((time.perf_counter() - started) * 1000)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    p99 = float(np.percentile(latencies, 99))
    print(
        f"\nfull-queue refusal latency over 200 calls: p50 {np.median(latencies):.2f} ms, "
        f"p99 {p99:.2f} ms"
    )
    assert p99 < 50


def _outcome(stub: Any, request: Any) -> grpc.StatusCode:
    try:
        stub.ModelInfer(request, timeout=0.3)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def test_repeated_request_is_answered_from_the_cache(up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(up.url)
    x = np.array([[0.5, 1.5, -2.0, 3.0]], np.float32)
    first = client.infer("mlp_cached", [mlp_input(x)], request_id="c1")
    second = client.infer("mlp_cached", [mlp_input(x)], request_id="c2")
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), second.as_numpy("OUTPUT0"))
    params = second.get_response(as_json=True)["parameters"]
    assert params["tiermesh.cache_hit"]["bool_param"] is True
    assert "tiermesh.cache_hit" not in first.get_response(as_json=True)["parameters"]
    # The hit's trace has the gateway and nothing else: no router, no worker.
    gw = eventually(
        lambda: [
            s
            for s in spans_where(up, **{"tiermesh.client_request_id": "c2"})
            if s["name"] == MODEL_INFER
        ],
        "the cache hit's span",
    )[0]
    assert gw["attributes"]["tiermesh.cache_hit"] is True
    trace_id = gw["context"]["trace_id"]
    services = {
        s["resource"]["attributes"]["service.name"]
        for s in up.spans()
        if s["context"]["trace_id"] == trace_id
    }
    assert services == {"tiermesh-gateway"}

    # Entries expire (TTL 1 s): the same request is computed again.
    def recomputed() -> bool:
        r = client.infer("mlp_cached", [mlp_input(x)])
        return "tiermesh.cache_hit" not in r.get_response(as_json=True)["parameters"]

    eventually(recomputed, "the cache entry to expire", timeout_s=10)


def test_worker_counters_and_the_in_flight_limit(new_up: Callable[..., UpProcess]) -> None:
    """A gateway with TIERMESH_MAX_IN_FLIGHT=1 refuses concurrent requests beyond the first
    at once; the worker's own counters (logged at stop) agree with the traces."""
    mesh = new_up(extra_env={"TIERMESH_MAX_IN_FLIGHT": "1"})
    x = np.ones((1, 4), np.float32)

    async def burst() -> list[str]:
        client = aioclient.InferenceServerClient(mesh.url)
        try:
            calls = []
            for _ in range(6):
                inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
                inp.set_data_from_numpy(x)
                calls.append(client.infer("mlp", [inp], timeout=1_000_000))
            out = await asyncio.gather(*calls, return_exceptions=True)
        finally:
            await client.close()
        return [o.message() if isinstance(o, InferenceServerException) else "ok" for o in out]

    with worker_paused(mesh):
        answers = asyncio.run(burst())
    refused = [a for a in answers if "in flight" in a]
    expired = [a for a in answers if "deadline" in a]
    assert len(refused) >= 1 and len(expired) >= 1, answers
    assert len(refused) + len(expired) == 6, answers
    eventually(lambda: [s for s in mesh.spans() if s["name"] == "expired"], "a drop")
    grpcclient.InferenceServerClient(mesh.url).infer("mlp", [mlp_input(x)])
    assert mesh.interrupt() == 0
    stopped = next(
        json.loads(line) for line in mesh.log.read_text().splitlines() if '"worker stopped"' in line
    )
    spans = mesh.spans()
    assert stopped["expired"] == len(expired) == sum(s["name"] == "expired" for s in spans)
    assert stopped["computed_rows"] == sum(s["name"] == "compute" for s in spans) == 1
