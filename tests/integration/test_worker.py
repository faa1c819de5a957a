"""The batcher-worker against real Redis, a real postprocess and a real Delivery server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis

from tests.conftest import copy_repository
from tests.integration.conftest import Downstream
from tests.polling import until
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import make_channel
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import encode_job
from tiermesh.up.processes import free_port
from tiermesh.worker.handoff import HANDOFF_ATTEMPTS, Handoff, PostprocessClient
from tiermesh.worker.loop import Worker
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.streams import Entry, StreamClient

pytestmark = pytest.mark.integration
UNIT = ComputeUnit("mlp", "1", "fp32")
STREAM = StreamKey(UNIT, "center", 2, 0)


class RecordingStreams(StreamClient):
    """The real StreamClient, noting the BLOCK of each read."""

    def __init__(self, redis: aioredis.Redis, consumer: str) -> None:
        super().__init__(redis, consumer)
        self.reads: list[tuple[int, int | None]] = []

    async def read(
        self, streams: Sequence[StreamKey], count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]:
        self.reads.append((len(streams), block_ms))
        return await super().read(streams, count, block_ms, pending)


def make_worker(
    redis: aioredis.Redis,
    repo_path: Path,
    postprocess: str,
    streams: StreamClient | None = None,
    handoff: Handoff | None = None,
    **options: Any,
) -> Worker:
    """A worker of mlp; its results go to `postprocess` unless `handoff` says otherwise."""
    telemetry = Telemetry("worker-test")
    repo = ModelRepository(repo_path)
    cfg = repo.load()["mlp"]
    return Worker(
        tier="center",
        configs={UNIT: cfg},
        runners={UNIT: ModelRunner(cfg, repo.checked_file("mlp"))},
        streams=streams or StreamClient(redis, "w1"),
        handoff=handoff or PostprocessClient(make_channel(postprocess), timeout_s=1),
        telemetry=telemetry,
        poll_block_ms=50,
        **options,
    )


def job(
    request_id: str, gateway: str, deadline_ns: int, x: np.ndarray, routed_ns: int = 0
) -> bytes:
    return encode_job(
        Job(
            request_id=request_id,
            model="mlp",
            inputs=(from_numpy("INPUT0", x, "FP32"),),
            gateway=gateway,
            deadline_ns=deadline_ns,
            priority=STREAM.priority,
            tier=STREAM.tier,
            timing=Timing(routed_ns=routed_ns),
        )
    )


async def test_expired_and_cancelled_jobs_are_dropped_never_computed(
    redis_url: str, model_repo: Path, downstream: Downstream
) -> None:
    """Nobody waits for them (the gateway answered the expired one itself, the cancelled
    one's caller left): they are acknowledged and deleted without compute or hand-off.
    They were queued a while ago, so the cancel flags are read before compute (a batch
    of requests that just arrived reads them meanwhile: worker/batching.py)."""
    redis = aioredis.Redis.from_url(redis_url)
    worker = make_worker(redis, model_repo, downstream.postprocess_address)
    old = downstream.pending.register("old")
    new = downstream.pending.register("new")
    downstream.pending.register("gone")
    await redis.set(keys.cancel_key("gone"), b"1", px=60_000)
    now = time.time_ns()
    x = np.ones((1, 4), np.float32)
    later = now + 30 * 10**9
    queued = now - 10**9
    for rid, deadline in (("old", now - 1), ("gone", later), ("new", later)):
        entry = job(rid, downstream.delivery_address, deadline, x, queued)
        await redis.xadd(STREAM.name, {keys.JOB_FIELD: entry})
    task = asyncio.create_task(worker.run())
    try:
        new_result = await asyncio.wait_for(new, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert new_result.code == grpc.StatusCode.OK
    assert new_result.outputs[0].shape == (1, 3)
    assert not old.done()  # never handed off
    assert worker.computed_rows == 1 and worker.expired == 1 and worker.cancelled == 1
    assert await redis.xlen(STREAM.name) == 0  # all acknowledged and deleted
    assert (await redis.xpending(STREAM.name, keys.GROUP))["pending"] == 0
    await redis.aclose()


async def test_entries_stay_pending_when_the_hand_off_fails(
    redis_url: str, model_repo: Path
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    nobody = f"127.0.0.1:{free_port()}"  # no postprocess listens here
    worker = make_worker(redis, model_repo, nobody)
    await redis.xadd(
        STREAM.name,
        {
            keys.JOB_FIELD: job(
                "r1", nobody, time.time_ns() + 60 * 10**9, np.ones((1, 4), np.float32)
            )
        },
    )
    await StreamClient(redis, "w1").ensure_groups([STREAM])
    task = asyncio.create_task(worker.run())
    deadline = time.monotonic() + 10
    while (await redis.xpending(STREAM.name, keys.GROUP))["pending"] == 0:  # poll, bounded
        assert time.monotonic() < deadline, "worker never read the entry"
        await asyncio.sleep(0.01)
    worker.stop()  # finishes the batch in hand: retries the hand-off, then gives up
    await asyncio.wait_for(task, 30)
    assert worker.computed_rows == 1
    assert await redis.xlen(STREAM.name) == 1
    assert (await redis.xpending(STREAM.name, keys.GROUP))["pending"] == 1
    await redis.aclose()


class FailingFirst:
    """A hand-off whose first `failures` calls fail as an unreachable next hop would; then
    it takes every result."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.taken: list[JobResult] = []
        self.unsent = 0

    async def process(self, results: Sequence[JobResult]) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            metadata = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, metadata, metadata, "down")
        self.taken += results

    async def close(self) -> None:
        pass


async def test_an_entry_whose_result_could_not_go_is_computed_again_not_poison(
    redis_url: str, model_repo: Path
) -> None:
    """The hand-off fails through every retry: the computed entry stays pending and comes
    back (a delivery more, past max_deliveries), yet it never failed in the model, so it
    is computed again and its result goes, instead of being dead-lettered."""
    redis = aioredis.Redis.from_url(redis_url)
    handoff = FailingFirst(HANDOFF_ATTEMPTS)
    worker = make_worker(
        redis,
        model_repo,
        "unused",
        handoff=handoff,
        reclaim_interval_ms=50,
        reclaim_min_idle_ms=100,
        max_deliveries=1,
    )
    x = np.ones((1, 4), np.float32)
    await StreamClient(redis, "w1").ensure_groups([STREAM])
    await redis.xadd(STREAM.name, {keys.JOB_FIELD: job("r1", "gw", time.time_ns() + 60 * 10**9, x)})
    task = asyncio.create_task(worker.run())

    async def handed_off() -> bool:
        return bool(handoff.taken)

    try:
        await until(handed_off, "the result handed off", 30)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    # Answered (at least once: the gateway keeps the first), never given up on.
    assert {(r.request_id, r.code) for r in handoff.taken} == {("r1", grpc.StatusCode.OK)}
    assert worker.dead_lettered == 0
    assert worker.computed_rows >= 2 and worker.reclaimed >= 1
    assert await redis.xlen(keys.dead_letter_key(STREAM.unit, STREAM.tier)) == 0
    assert await redis.xlen(STREAM.name) == 0  # acknowledged once it went
    await redis.aclose()


@pytest.mark.parametrize("adaptive", [False, True])
async def test_batch_wait_never_blocks_in_redis(
    redis_url: str, tmp_path: Path, downstream: Downstream, adaptive: bool
) -> None:
    """Redis ends a blocked read only on its 100 ms server tick: a 2 ms batch wait that
    blocked in XREADGROUP would last 100 ms. Filling a batch must poll instead. With the
    adaptive wait (the default) a lone request on a quiet stream waits for nobody."""
    repo = copy_repository(tmp_path)
    cfg = repo / "mlp" / "config.yaml"
    text = cfg.read_text().replace(
        "batching:\n", f"batching:\n  adaptive_wait: {str(adaptive).lower()}\n"
    )
    if not adaptive:  # a wait a loaded machine cannot skip before the first fill (2 ms can)
        text = text.replace("max_batch_wait_ms: 2\n", "max_batch_wait_ms: 50\n")
        assert "max_batch_wait_ms: 50" in text
    assert text != cfg.read_text()
    cfg.write_text(text)
    redis = aioredis.Redis.from_url(redis_url)
    streams = RecordingStreams(redis, "w1")
    worker = make_worker(redis, repo, downstream.postprocess_address, streams)
    lone = downstream.pending.register("lone")
    entry = job(
        "lone",
        downstream.delivery_address,
        time.time_ns() + 30 * 10**9,
        np.ones((1, 4), np.float32),
    )
    await redis.xadd(STREAM.name, {keys.JOB_FIELD: entry})
    task = asyncio.create_task(worker.run())
    try:
        result = await asyncio.wait_for(lone, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert result.code == grpc.StatusCode.OK
    fills = [block for n, block in streams.reads if n == 1]
    if adaptive:
        assert not fills, "a lone request on a quiet stream waited for company"
    else:
        assert fills, "a lone request should have waited for company"
        assert all(block is None for block in fills)
    await redis.aclose()


async def test_reclaim_many_takes_over_every_streams_idle_entries_in_one_round_trip(
    redis_url: str,
) -> None:
    """Up to each stream's room; a stream whose group is gone is left out, not the rest."""
    redis = aioredis.Redis.from_url(redis_url)
    other = StreamKey(UNIT, "center", 1, 0)
    nogroup = StreamKey(UNIT, "edge", 2, 0)
    dead = StreamClient(redis, "dead-worker")
    await dead.ensure_groups([STREAM, other])
    await redis.xadd(nogroup.name, {keys.JOB_FIELD: b"x"})  # a stream without the group
    for key, n in ((STREAM, 3), (other, 1)):
        for _ in range(n):
            await redis.xadd(key.name, {keys.JOB_FIELD: b"x"})
    assert len(await dead.read([STREAM, other], 10, None)) == 4  # read, then it "dies"
    alive = StreamClient(redis, "w2")
    try:
        taken = await alive.reclaim_many({STREAM: 2, other: 5, nogroup: 5}, 0)
        assert {k: len(v) for k, v in taken.items()} == {STREAM: 2, other: 1}
        assert await alive.reclaim_many({}, 0) == {}
        pending = await redis.xpending_range(STREAM.name, keys.GROUP, "-", "+", 10)
        assert sorted(p["consumer"] for p in pending) == [b"dead-worker", b"w2", b"w2"]
    finally:
        await redis.aclose()


async def test_a_dead_workers_entries_are_reclaimed(
    redis_url: str, model_repo: Path, downstream: Downstream
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    dead = StreamClient(redis, "dead-worker")
    await dead.ensure_groups([STREAM])
    answer = downstream.pending.register("orphan")
    x = np.ones((1, 4), np.float32)
    await redis.xadd(
        STREAM.name,
        {
            keys.JOB_FIELD: job(
                "orphan", downstream.delivery_address, time.time_ns() + 30 * 10**9, x
            )
        },
    )
    assert len(await dead.read([STREAM], 10, None)) == 1  # read, then it "dies"
    worker = make_worker(
        redis,
        model_repo,
        downstream.postprocess_address,
        reclaim_interval_ms=50,
        reclaim_min_idle_ms=100,
    )
    task = asyncio.create_task(worker.run())
    try:
        result = await asyncio.wait_for(answer, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert result.code == grpc.StatusCode.OK and result.outputs[0].shape == (1, 3)
    assert worker.reclaimed == 1
    assert await redis.xlen(STREAM.name) == 0
    await redis.aclose()


async def test_an_entry_delivered_too_often_is_dead_lettered(
    redis_url: str, model_repo: Path, downstream: Downstream
) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    dead = StreamClient(redis, "dead-1")
    await dead.ensure_groups([STREAM])
    answer = downstream.pending.register("poison")
    x = np.ones((1, 4), np.float32)
    entry_id = await redis.xadd(
        STREAM.name,
        {
            keys.JOB_FIELD: job(
                "poison", downstream.delivery_address, time.time_ns() + 30 * 10**9, x
            )
        },
    )
    await dead.read([STREAM], 10, None)  # delivery 1
    for name in ("dead-2", "dead-3"):  # deliveries 2 and 3, each worker died with it
        await redis.xclaim(STREAM.name, keys.GROUP, name, 0, [entry_id])
    worker = make_worker(
        redis,
        model_repo,
        downstream.postprocess_address,
        reclaim_interval_ms=50,
        reclaim_min_idle_ms=1,
        max_deliveries=3,
    )
    task = asyncio.create_task(worker.run())
    try:
        result = await asyncio.wait_for(answer, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert result.code == grpc.StatusCode.ABORTED
    assert "4 failed deliveries" in result.message
    assert worker.dead_lettered == 1 and worker.computed_rows == 0
    dlq = await redis.xrange(keys.dead_letter_key(STREAM.unit, STREAM.tier))
    assert len(dlq) == 1 and dlq[0][1][b"reason"] == b"delivered 4 times"
    assert await redis.xlen(STREAM.name) == 0
    await redis.aclose()


async def test_a_poison_request_is_dead_lettered_and_spares_its_batch(
    redis_url: str, model_repo: Path, downstream: Downstream
) -> None:
    """A request the model fails on (a shape only a client bypassing the gateway could send)
    is batched beside a good one: the good one is answered, the poison one dead-lettered."""
    redis = aioredis.Redis.from_url(redis_url)
    good = downstream.pending.register("good")
    bad = downstream.pending.register("bad")
    later = time.time_ns() + 30 * 10**9
    await redis.xadd(
        STREAM.name,
        {
            keys.JOB_FIELD: job(
                "bad", downstream.delivery_address, later, np.ones((1, 5), np.float32)
            )
        },
    )
    await redis.xadd(
        STREAM.name,
        {
            keys.JOB_FIELD: job(
                "good", downstream.delivery_address, later, np.ones((1, 4), np.float32)
            )
        },
    )
    worker = make_worker(redis, model_repo, downstream.postprocess_address)
    task = asyncio.create_task(worker.run())
    try:
        good_result = await asyncio.wait_for(good, 10)
        bad_result = await asyncio.wait_for(bad, 10)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert good_result.code == grpc.StatusCode.OK and good_result.outputs[0].shape == (1, 3)
    assert bad_result.code == grpc.StatusCode.ABORTED
    assert worker.dead_lettered == 1 and worker.computed_rows == 1
    assert await redis.xlen(keys.dead_letter_key(STREAM.unit, STREAM.tier)) == 1
    assert await redis.xlen(STREAM.name) == 0
    await redis.aclose()
