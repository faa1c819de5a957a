"""Bounded, atomic admission onto a work stream against a real redis-server."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.admission_script import ADMISSION_SCRIPT
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.router.admission import Admitter, Enqueue
from tiermesh.worker.streams import StreamClient

pytestmark = pytest.mark.integration
UNIT = ComputeUnit("m", "1", "fp32")
STREAM = StreamKey(UNIT, "center", 1, 0)


def rid() -> str:
    return uuid.uuid4().hex


async def test_no_live_worker_is_refused(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    admitter = Admitter(redis)
    assert (await admitter.admit(STREAM, 10, b"job", {}, request_id=rid())).outcome == "noworker"
    # A heartbeat that has expired does not count either.
    await redis.zadd(keys.workers_key(UNIT, "center"), {"w-old": int(time.time() * 1000) - 1})
    assert (await admitter.admit(STREAM, 10, b"job", {}, request_id=rid())).outcome == "noworker"
    assert await redis.xlen(STREAM.name) == 0
    await redis.aclose()


async def test_queue_bound_refuses_without_trimming(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    tp = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    outcomes = [
        await admitter.admit(STREAM, 3, f"job{i}".encode(), tp, request_id=rid()) for i in range(5)
    ]
    assert [o.outcome for o in outcomes] == ["ok", "ok", "ok", "full", "full"]
    assert outcomes[3].detail == "3"
    entries = await redis.xrange(STREAM.name)
    assert [e[1][keys.JOB_FIELD.encode()] for e in entries] == [b"job0", b"job1", b"job2"]
    assert entries[0][1][keys.TRACEPARENT_FIELD.encode()] == tp["traceparent"].encode()
    # Work handed off is deleted, which makes room again.
    await redis.xdel(STREAM.name, entries[0][0])
    assert (await admitter.admit(STREAM, 3, b"job5", tp, request_id=rid())).outcome == "ok"
    await redis.aclose()


async def test_model_wide_bound_counts_every_stream(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    streams = [StreamKey(UNIT, "center", p, b) for p in (1, 2) for b in (0, 1)]
    outcomes = []
    for i, target in enumerate(streams * 2):  # two per stream, per-stream bound 10
        a = await admitter.admit(
            target,
            10,
            f"j{i}".encode(),
            {},
            request_id=rid(),
            model_streams=streams,
            model_bound=5,
        )
        outcomes.append(a.outcome)
    assert outcomes == ["ok"] * 5 + ["modelfull"] * 3
    assert sum([await redis.xlen(s.name) for s in streams]) == 5
    await redis.aclose()


async def test_a_queue_that_cannot_drain_in_time_is_refused(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    for i in range(4):
        assert (
            await admitter.admit(STREAM, 100, f"j{i}".encode(), {}, request_id=rid())
        ).outcome == "ok"
    # Workers measured 10 entries/s on this stream: 4 ahead need ~400 ms.
    await redis.hset(keys.rate_key(UNIT, "center"), keys.rate_field(0), "10.0")
    late = await admitter.admit(STREAM, 100, b"x", {}, request_id=rid(), ms_left=300)
    assert (late.outcome, late.detail) == ("late", "400")
    assert (
        await admitter.admit(STREAM, 100, b"y", {}, request_id=rid(), ms_left=500)
    ).outcome == "ok"
    assert (
        await admitter.admit(STREAM, 100, b"z", {}, request_id=rid(), ms_left=-1)
    ).outcome == "ok"  # none
    await redis.aclose()


async def test_enqueue_is_idempotent_by_request_id(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    first = await admitter.admit(STREAM, 2, b"job", {}, request_id="r1", ms_left=10_000)
    again = await admitter.admit(STREAM, 2, b"job", {}, request_id="r1", ms_left=10_000)
    assert first.outcome == "ok"
    assert (again.outcome, again.detail) == ("dup", first.detail)
    assert await redis.xlen(STREAM.name) == 1
    # A retry is answered as queued even when the queue has filled up meanwhile.
    assert (await admitter.admit(STREAM, 2, b"j2", {}, request_id="r2")).outcome == "ok"
    assert (await admitter.admit(STREAM, 2, b"j3", {}, request_id="r3")).outcome == "full"
    assert (await admitter.admit(STREAM, 2, b"job", {}, request_id="r1")).outcome == "dup"
    # Remembered until the deadline has passed (plus a margin), not for ever.
    ttl_ms = await redis.pttl(keys.enqueued_key(UNIT.model, "r1"))
    assert 10_000 < ttl_ms <= 15_000
    await redis.aclose()


async def test_a_batch_is_decided_in_order_in_one_call(redis_url: str) -> None:
    """admit_many: one script call whose items see what the items before them queued, each
    with its own outcome, across streams, units and tiers (one without a worker)."""
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    other = StreamKey(UNIT, "center", 2, 1)
    edge = StreamKey(UNIT, "edge", 1, 0)  # no worker heartbeats on the edge tier
    tp = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    items = [
        Enqueue(STREAM, 2, b"a", tp, "r-a"),
        Enqueue(other, 2, b"b", {}, "r-b"),
        Enqueue(STREAM, 2, b"c", {}, "r-c"),
        Enqueue(STREAM, 2, b"a-again", {}, "r-a"),  # a retry within the batch
        Enqueue(STREAM, 2, b"d", {}, "r-d"),  # the stream is at its bound by now
        Enqueue(edge, 2, b"e", {}, "r-e"),
        Enqueue(other, 5, b"f", {}, "r-f", model_streams=[STREAM, other], model_bound=3),
        Enqueue(other, 5, b"g", {}, "r-g", model_streams=[STREAM, other]),  # no model bound
    ]
    outcomes = await admitter.admit_many(items)
    assert [o.outcome for o in outcomes] == [
        "ok", "ok", "ok", "dup", "full", "noworker", "modelfull", "ok"
    ]  # fmt: skip
    assert outcomes[3].detail == outcomes[0].detail  # the first entry's id
    assert outcomes[4].detail == "2" and outcomes[6].detail == "3"
    entries = await redis.xrange(STREAM.name)
    assert [e[1][keys.JOB_FIELD.encode()] for e in entries] == [b"a", b"c"]
    assert entries[0][1][keys.TRACEPARENT_FIELD.encode()] == tp["traceparent"].encode()
    assert [e[1][keys.JOB_FIELD.encode()] for e in await redis.xrange(other.name)] == [b"b", b"g"]
    assert await redis.xlen(edge.name) == 0
    await redis.aclose()


async def test_a_script_redis_lost_is_loaded_again(redis_url: str) -> None:
    """Redis restarted or flushed its scripts since the router loaded it: the batch still
    goes, once."""
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    admitter = Admitter(redis)
    assert (await admitter.admit(STREAM, 10, b"x", {}, request_id=rid())).outcome == "ok"
    await redis.script_flush()
    batch = [Enqueue(STREAM, 10, f"y{i}".encode(), {}, rid()) for i in range(3)]
    assert [a.outcome for a in await admitter.admit_many(batch)] == ["ok"] * 3
    assert await redis.xlen(STREAM.name) == 4
    await redis.aclose()


async def test_a_guard_key_sends_the_job_back_to_the_router(redis_url: str) -> None:
    """The front door's call (core/direct_plan.py): while the item's guard key exists (the
    model's rollout record) nothing is queued and the answer is `reroute`."""
    redis = aioredis.Redis.from_url(redis_url)
    await StreamClient(redis, "w1").heartbeat([UNIT], "center", ttl_ms=60_000)
    guard = keys.rollout_key("guarded-model")
    script = redis.register_script(ADMISSION_SCRIPT)

    async def place(request_id: str) -> list[bytes]:
        script_keys = [
            STREAM.name,
            keys.workers_key(UNIT, "center"),
            keys.rate_key(UNIT, "center"),
            keys.enqueued_key(UNIT.model, request_id),
            guard,
        ]
        fields = [keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD]
        item = [1, 2, 3, 4, 10, 0, keys.rate_field(0), -1, 60_000, b"job", "", "", 5, 0]
        return list(await script(keys=script_keys, args=[1, *fields, *item]))

    await redis.hset(guard, mapping={"model": "guarded-model", "stable": "1"})
    assert await place(rid()) == [b"reroute", b"0"]
    assert await redis.xlen(STREAM.name) == 0
    await redis.delete(guard)
    outcome, entry_id = await place(rid())
    assert outcome == b"ok" and [e[0] for e in await redis.xrange(STREAM.name)] == [entry_id]
    await redis.aclose()
