"""The Go load generator (tiermesh/bench/goload.py) against a real grpc.aio KServe servicer
on port 0 that answers by request id: OK with timing parameters, RESOURCE_EXHAUSTED with a
`retry-after-ms` trailer, or never (the call's deadline ends it)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.go_toolchain import needs_go
from tests.grpc_server import serving
from tiermesh.bench.goload import LoadConfig, LoadUnavailable, infer_request, run_load
from tiermesh.bench.records import Record
from tiermesh.bench.stats import figures
from tiermesh.bench.workload import RequestSpec, WorkloadTensor
from tiermesh.core.cache_dir import default_cache_dir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    needs_go,
]

RETRY_AFTER_MS = "250"
TOTAL_MS = 1.5


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Answers by the request's id: "ok" OK, "busy" RESOURCE_EXHAUSTED, "hang" never. Counts
    calls, the most answered at once, and the tenant header each call carried."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.tenants: Counter[str] = Counter()
        self.in_flight = 0
        self.peak = 0

    async def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> service_pb2.ModelInferResponse:
        self.calls[request.id] += 1
        self.tenants[dict(context.invocation_metadata() or ()).get("x-tenant", "")] += 1
        if request.id == "hang":
            await asyncio.Event().wait()  # until the caller's deadline cancels it
        # Answered calls only: a hung call's handler is cancelled some time after its
        # caller gave up and sent its next one.
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if request.id == "busy":
                context.set_trailing_metadata((("retry-after-ms", RETRY_AFTER_MS),))
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "over capacity")
            response = service_pb2.ModelInferResponse(model_name=request.model_name, id="ok")
            response.parameters["tiermesh.total_ms"].double_param = TOTAL_MS
            response.parameters["tiermesh.compute_ms"].double_param = 1.0
            response.parameters["tiermesh.batch_size"].int64_param = 4
            response.parameters["tiermesh.tier"].string_param = "edge"
            response.parameters["caller_param"].string_param = "not the mesh's"
            return response
        finally:
            self.in_flight -= 1


@pytest.fixture
async def served() -> AsyncIterator[tuple[Servicer, str]]:
    servicer = Servicer()
    async with serving(
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, servicer
    ) as address:
        yield servicer, address


def spec(length: str, priority: int = 0) -> RequestSpec:
    x = WorkloadTensor("x", "FP32", np.arange(16, dtype=np.float32).reshape(1, 16))
    return RequestSpec(0, length, priority, (x,))


OK_REQUEST = infer_request("mlp", spec("short"), request_id="ok")
BUSY_REQUEST = infer_request("mlp", spec("long", priority=2), request_id="busy")
HANG_REQUEST = infer_request("mlp", spec("hung"), request_id="hang")


def check_answers(records: list[Record]) -> None:
    """Each record's code, trailer and reply are those of the request it sent."""
    for r in records:
        if r.length == "short":
            assert r.outcome.code == "OK"
            assert r.outcome.retry_after_ms is None
            reply = r.outcome.reply
            assert reply is not None and reply.total_ms == TOTAL_MS
            assert reply.stages_ms == {"compute": 1.0}
            assert (reply.batch_size, reply.tier) == (4, "edge")
        else:
            assert (r.outcome.code, r.priority) == ("RESOURCE_EXHAUSTED", 2)
            assert r.outcome.retry_after_ms == float(RETRY_AFTER_MS)
            assert r.outcome.reply is None
        assert r.outcome.latency_ms > 0


async def test_open_loop_sends_the_schedule_and_reads_codes_trailers_and_replies(
    served: tuple[Servicer, str],
) -> None:
    servicer, address = served
    config = LoadConfig(
        target=address,
        requests=[OK_REQUEST, BUSY_REQUEST],
        mode="open",
        rate_rps=500.0,
        duration_s=1.0,
        deadline_ms=2000.0,
        seed=7,
        metadata={"x-tenant": "acme"},
        step=3,
    )
    run = await run_load(default_cache_dir(), config)

    n = len(run.records)
    assert 400 < n < 600  # Poisson at 500/s for 1 s: sd ~22
    assert servicer.calls == {"ok": (n + 1) // 2, "busy": n // 2}  # cycled in turn
    assert servicer.tenants == {"acme": n}
    check_answers(run.records)
    starts = [r.start_s for r in run.records]
    assert starts == sorted(starts) and 0 < starts[0] and starts[-1] < 1.0
    assert all(r.lag_ms > -1e-3 and math.isfinite(r.lag_ms) for r in run.records)
    assert all((r.step, r.concurrency) == (3, 0) for r in run.records)
    assert starts[-1] < run.wall_s < 3.0 and 0 < run.cpu_s < run.wall_s * 2

    fig = figures(run.records, run.wall_s)
    assert (fig.sent, fig.ok, fig.not_sent) == (n, (n + 1) // 2, 0)
    assert fig.errors_by_code == {"RESOURCE_EXHAUSTED": n // 2}

    # The same seed gives the same schedule.
    again = await run_load(default_cache_dir(), config)
    assert [r.start_s for r in again.records] == starts


async def test_closed_loop_keeps_its_callers_and_deadlines_end_hung_calls(
    served: tuple[Servicer, str],
) -> None:
    servicer, address = served
    config = LoadConfig(
        target=address,
        requests=[OK_REQUEST, BUSY_REQUEST, HANG_REQUEST],
        mode="closed",
        concurrency=4,
        duration_s=0.5,
        deadline_ms=100.0,
        order="random",
        seed=1,
        connections=2,
    )
    run = await run_load(default_cache_dir(), config)

    by_length = Counter(r.length for r in run.records)
    assert set(by_length) == {"short", "long", "hung"}
    assert sum(servicer.calls.values()) == len(run.records)
    assert servicer.peak <= 4
    check_answers([r for r in run.records if r.length != "hung"])
    hung = [r for r in run.records if r.length == "hung"]
    assert {r.outcome.code for r in hung} == {"DEADLINE_EXCEEDED"}
    assert all(90 <= r.outcome.latency_ms < 1000 for r in hung)
    assert all((r.concurrency, r.lag_ms) == (4, 0.0) for r in run.records)
    assert all(r.start_s < 0.5 for r in run.records)


@pytest.mark.parametrize("honour", [False, True])
async def test_a_closed_loop_caller_waits_the_retry_after_when_told_to(
    served: tuple[Servicer, str], honour: bool
) -> None:
    servicer, address = served
    config = LoadConfig(
        target=address,
        requests=[BUSY_REQUEST],
        mode="closed",
        concurrency=2,
        duration_s=1.0,
        deadline_ms=1000.0,
        honour_retry_after=honour,
    )
    run = await run_load(default_cache_dir(), config)

    check_answers(run.records)
    assert servicer.calls == {"busy": len(run.records)}
    if honour:
        # 250 ms between a caller's calls: at 0, 0.25, 0.5 and 0.75 s each (fewer where a
        # loaded machine answers slowly).
        assert 6 <= len(run.records) <= 8
        for caller_starts in (run.records[0::2], run.records[1::2]):
            gaps = np.diff([r.start_s for r in caller_starts])
            assert all(gaps >= float(RETRY_AFTER_MS) / 1000)
    else:
        assert len(run.records) > 40  # back to back: a refusal takes ~1 ms here


async def test_a_config_it_cannot_run_is_a_clear_error(served: tuple[Servicer, str]) -> None:
    _, address = served
    bad = LoadConfig(target=address, requests=[OK_REQUEST], duration_s=1.0, deadline_ms=10)
    with pytest.raises(LoadUnavailable, match="open mode needs rate_rps > 0"):
        await run_load(default_cache_dir(), bad)
