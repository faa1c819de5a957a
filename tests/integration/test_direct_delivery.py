"""A worker's batch with no output step left goes straight to its gateway's Delivery port;
one that still needs postprocess (it carries the pooling mask) goes through postprocess.
Real Delivery and Postprocess servers on port 0, a real worker against real Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from tests.integration.conftest import Downstream
from tests.integration.test_worker import STREAM, job, make_worker
from tiermesh.core import keys
from tiermesh.core.delivery_client import GatewayClients, deliveries_counter
from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.server import make_channel
from tiermesh.core.tensors import from_numpy
from tiermesh.up.processes import free_port
from tiermesh.worker.handoff import DirectHandoff, PostprocessClient, skips_postprocess

pytestmark = pytest.mark.integration
MASK = from_numpy("attention_mask", np.ones((1, 3), np.int64), "INT64")


def result(request_id: str, gateway: str, *, aux: bool = False, ok: bool = True) -> JobResult:
    return JobResult(
        request_id=request_id,
        model="mlp",
        gateway=gateway,
        code=grpc.StatusCode.OK if ok else grpc.StatusCode.INTERNAL,
        outputs=(from_numpy("OUTPUT0", np.ones((1, 3), np.float32), "FP32"),) if ok else (),
        aux=(MASK,) if aux else (),
        timing=Timing(batch_end_ns=5),
    )


def test_only_a_batch_without_step_inputs_skips_postprocess() -> None:
    assert skips_postprocess([result("a", "g"), result("b", "g", ok=False)])
    assert not skips_postprocess([result("a", "g"), result("b", "g", aux=True)])


def handoff(postprocess: str, registry: CollectorRegistry) -> DirectHandoff:
    return DirectHandoff(
        PostprocessClient(make_channel(postprocess), timeout_s=1),
        GatewayClients(1),
        deliveries_counter(registry),
        clock_ns=lambda: 7,
    )


def counted(registry: CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value("tiermesh_deliveries_total", {"outcome": outcome})


async def test_a_batch_without_step_reaches_its_gateway_with_no_postprocess_up(
    downstream: Downstream,
) -> None:
    """Nothing listens where postprocess should be: the batch is answered all the same,
    stamped postprocessed by the worker's clock and marked direct."""
    registry = CollectorRegistry()
    direct = handoff(f"127.0.0.1:{free_port()}", registry)
    waiting = [downstream.pending.register(rid) for rid in ("d1", "d2")]
    try:
        await direct.process([result(r, downstream.delivery_address) for r in ("d1", "d2")])
        got = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    finally:
        await direct.close()
    assert [r.request_id for r in got] == ["d1", "d2"]
    assert all(r.direct and r.timing.postprocessed_ns == 7 for r in got)
    assert all(r.timing.batch_end_ns == 5 for r in got)
    assert counted(registry, "delivered") == 2


async def test_a_batch_with_step_inputs_goes_through_postprocess(downstream: Downstream) -> None:
    registry = CollectorRegistry()
    direct = handoff(downstream.postprocess_address, registry)
    waiting = downstream.pending.register("p1")
    try:
        await direct.process([result("p1", downstream.delivery_address, aux=True)])
        got = await asyncio.wait_for(waiting, 5)
    finally:
        await direct.close()
    assert not got.direct
    assert got.timing.postprocessed_ns not in (0, 7)  # postprocess's clock stamped it
    assert counted(registry, "delivered") is None  # postprocess counted it, not the worker


async def test_a_gone_gateway_is_counted_undeliverable_not_retried(
    downstream: Downstream,
) -> None:
    """As in postprocess: the gateway's callers are gone with it; the other gateway of the
    same batch still gets its result."""
    registry = CollectorRegistry()
    direct = handoff(downstream.postprocess_address, registry)
    gone = f"127.0.0.1:{free_port()}"
    waiting = downstream.pending.register("here")
    try:
        await asyncio.wait_for(
            direct.process([result("lost", gone), result("here", downstream.delivery_address)]),
            10,
        )
        assert (await asyncio.wait_for(waiting, 5)).request_id == "here"
    finally:
        await direct.close()
    assert counted(registry, "undeliverable") == 1
    assert counted(registry, "delivered") == 1


async def test_a_worker_with_direct_delivery_answers_and_acknowledges(
    redis_url: str, model_repo: Path, downstream: Downstream
) -> None:
    """The worker's whole path: read, compute, deliver to the gateway (postprocess is not
    even running), acknowledge and delete the entry."""
    redis = aioredis.Redis.from_url(redis_url)
    registry = CollectorRegistry()
    nobody = f"127.0.0.1:{free_port()}"
    worker = make_worker(redis, model_repo, nobody, handoff=handoff(nobody, registry))
    waiting = downstream.pending.register("w")
    x = np.full((1, 4), 2, np.float32)
    entry = job("w", downstream.delivery_address, time.time_ns() + 30 * 10**9, x)
    await redis.xadd(STREAM.name, {keys.JOB_FIELD: entry})
    task = asyncio.create_task(worker.run())
    try:
        got = await asyncio.wait_for(waiting, 10)
        worker.stop()
        await asyncio.wait_for(task, 10)  # its hand-offs and acks drained
        assert await redis.xlen(STREAM.name) == 0
        assert (await redis.xpending(STREAM.name, keys.GROUP))["pending"] == 0
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await redis.aclose()
    assert got.code == grpc.StatusCode.OK and got.direct
    assert got.outputs[0].shape == (1, 3)
    assert counted(registry, "delivered") == 1
    assert worker.computed_rows == 1
