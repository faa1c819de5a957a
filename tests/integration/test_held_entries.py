"""A worker's entries it read and has not acknowledged (worker/streams.py, "held") never idle
into a reclaim, its own or another worker's, however long their batch takes; a dead
worker's still do. Real Redis; the holder's clock is injected, Redis's idle time is real."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tests.polling import until
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.settings import WorkerSettings
from tiermesh.worker.streams import HOLD_LIMIT, StreamClient

pytestmark = pytest.mark.integration

STREAM = StreamKey(ComputeUnit("mlp", "1", "fp32"), "center", 2, 0)
MIN_IDLE_MS = 40


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    await client.delete(STREAM.name)
    yield client
    await client.delete(STREAM.name)
    await client.aclose()


async def pending(redis: aioredis.Redis, entry_id: str) -> tuple[str, int, int]:
    """(owner, idle ms, deliveries) of a pending entry."""
    (row,) = await redis.xpending_range(STREAM.name, keys.GROUP, entry_id, entry_id, 1)
    return row["consumer"].decode(), row["time_since_delivered"], row["times_delivered"]


async def idle_at_least(redis: aioredis.Redis, entry_id: str, ms: int) -> None:
    async def idle() -> bool:
        return (await pending(redis, entry_id))[1] >= ms

    await until(idle, f"entry idle {ms} ms", timeout_s=5, interval_s=0.005)


async def test_a_held_entry_is_touched_not_reclaimed(redis: aioredis.Redis) -> None:
    now = [0.0]  # the worker's clock (ms), moved by hand
    worker, other = StreamClient(redis, "w1", lambda: now[0]), StreamClient(redis, "w2")
    await worker.ensure_groups([STREAM])
    slow = (await redis.xadd(STREAM.name, {keys.JOB_FIELD: b"slow"})).decode()
    (entry,) = await worker.read([STREAM], 10, None)
    assert worker.held(STREAM) == {slow}
    await idle_at_least(redis, slow, MIN_IDLE_MS)
    # Its batch is still computing, a quarter of the idle time on by the worker's clock:
    # the worker's reclaim round touches it first, and takes nothing of its own.
    now[0] += MIN_IDLE_MS / 4
    assert await worker.reclaim_many({STREAM: 10}, MIN_IDLE_MS) == {}
    owner, idle, deliveries = await pending(redis, slow)
    assert (owner, deliveries) == ("w1", 1) and idle < MIN_IDLE_MS
    # Another worker's reclaim right after finds nothing idle long enough.
    assert await other.reclaim_many({STREAM: 10}, MIN_IDLE_MS) == {}
    await worker.done(STREAM, [entry.entry_id])
    assert worker.held(STREAM) == set()


async def test_an_entry_not_touched_is_reclaimed_and_its_own_never_twice(
    redis: aioredis.Redis,
) -> None:
    """Without the touch (the holder died, or its clock says the entry is young), another
    worker takes the entry over; the taker then holds it, so its own next round does not
    take it again (a second delivery, a second compute)."""
    now = [0.0]  # the taker's clock (ms)
    dead = StreamClient(redis, "dead", lambda: 0.0)  # its clock stands still: it died
    taker = StreamClient(redis, "w2", lambda: now[0])
    await dead.ensure_groups([STREAM])
    eid = (await redis.xadd(STREAM.name, {keys.JOB_FIELD: b"orphan"})).decode()
    await dead.read([STREAM], 10, None)
    await idle_at_least(redis, eid, MIN_IDLE_MS)
    taken = await taker.reclaim_many({STREAM: 10}, MIN_IDLE_MS)
    assert [e.entry_id for e in taken[STREAM]] == [eid]
    assert taker.held(STREAM) == {eid}
    await idle_at_least(redis, eid, MIN_IDLE_MS)  # its batch takes long...
    now[0] += MIN_IDLE_MS / 4
    assert await taker.reclaim_many({STREAM: 10}, MIN_IDLE_MS) == {}
    assert (await pending(redis, eid))[::2] == ("w2", 2)


async def test_an_entry_acknowledged_elsewhere_is_let_go(redis: aioredis.Redis) -> None:
    """A held entry no longer pending (dead-lettered, or acknowledged by a worker that had
    reclaimed it) is dropped from what the worker holds at its next touch."""
    now = [0.0]
    worker = StreamClient(redis, "w1", lambda: now[0])
    await worker.ensure_groups([STREAM])
    eid = (await redis.xadd(STREAM.name, {keys.JOB_FIELD: b"x"})).decode()
    await worker.read([STREAM], 10, None)
    await redis.xack(STREAM.name, keys.GROUP, eid)
    now[0] += MIN_IDLE_MS
    await worker.reclaim_many({}, MIN_IDLE_MS)
    assert worker.held(STREAM) == set()


async def test_work_given_up_is_let_go_for_a_reclaim(redis: aioredis.Redis) -> None:
    """Held HOLD_LIMIT times the idle time (its hand-off gave up: "entries stay pending"),
    an entry is no longer touched, and another worker takes it over once idle."""
    now = [0.0]
    worker, other = StreamClient(redis, "w1", lambda: now[0]), StreamClient(redis, "w2")
    await worker.ensure_groups([STREAM])
    eid = (await redis.xadd(STREAM.name, {keys.JOB_FIELD: b"x"})).decode()
    await worker.read([STREAM], 10, None)
    now[0] += (HOLD_LIMIT - 1) * MIN_IDLE_MS
    await worker.reclaim_many({}, MIN_IDLE_MS)
    assert worker.held(STREAM) == {eid}  # still worked on: touched
    now[0] += MIN_IDLE_MS
    await worker.reclaim_many({}, MIN_IDLE_MS)
    assert worker.held(STREAM) == set()
    await idle_at_least(redis, eid, MIN_IDLE_MS)
    taken = await other.reclaim_many({STREAM: 10}, MIN_IDLE_MS)
    assert [e.entry_id for e in taken[STREAM]] == [eid]


async def test_an_entry_whose_ack_failed_is_let_go(redis: aioredis.Redis) -> None:
    """An acknowledgement that did not reach Redis leaves the entry to be delivered again."""
    worker = StreamClient(redis, "w1")
    await worker.ensure_groups([STREAM])
    await redis.xadd(STREAM.name, {keys.JOB_FIELD: b"x"})
    (entry,) = await worker.read([STREAM], 10, None)
    await redis.delete(STREAM.name)
    await redis.set(STREAM.name, b"not a stream")  # XACK fails: WRONGTYPE
    with pytest.raises(aioredis.ResponseError):
        await worker.done(STREAM, [entry.entry_id])
    assert worker.held(STREAM) == set()


def test_reclaim_rounds_must_come_at_least_every_half_of_the_idle_time() -> None:
    with pytest.raises(ValueError, match="at most half of TIERMESH_RECLAIM_MIN_IDLE_MS"):
        WorkerSettings(reclaim_interval_ms=3000, reclaim_min_idle_ms=5000)
    defaults = WorkerSettings()
    assert defaults.reclaim_interval_ms * 2 <= defaults.reclaim_min_idle_ms
