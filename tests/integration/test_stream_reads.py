"""A worker's read of new entries (worker/streams.py, StreamClient.read_checking) against a
real Redis: several XREADGROUPs with their own counts and the cancel flags in one round
trip; reads that may block merged into one."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.worker.streams import StreamClient, StreamRead

pytestmark = pytest.mark.integration

UNIT = ComputeUnit("mlp", "1", "fp32")
HIGH = StreamKey(UNIT, "center", 1, 0)
LOW = StreamKey(UNIT, "center", 2, 0)


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    names = [HIGH.name, LOW.name, keys.cancel_key("gone"), keys.cancel_key("here")]
    await client.delete(*names)
    yield client
    await client.delete(*names)
    await client.aclose()


async def test_each_read_counts_its_own_and_the_flags_come_along(redis: aioredis.Redis) -> None:
    worker = StreamClient(redis, "w1")
    await worker.ensure_groups([HIGH, LOW])
    for i in range(5):
        await redis.xadd(HIGH.name, {keys.JOB_FIELD: f"h{i}".encode()})
        await redis.xadd(LOW.name, {keys.JOB_FIELD: f"l{i}".encode()})
    await redis.set(keys.cancel_key("gone"), b"1")

    entries, gone = await worker.read_checking(
        [StreamRead([HIGH], 2), StreamRead([LOW], 1)], None, ["gone", "here"]
    )
    assert gone == {"gone"}
    assert [e.fields[keys.JOB_FIELD.encode()] for e in entries] == [b"h0", b"h1", b"l0"]
    # Without flags to read, the same; a read of no stream is dropped.
    entries, gone = await worker.read_checking(
        [StreamRead([HIGH], 1), StreamRead([], 9), StreamRead([LOW], 2)], None, []
    )
    assert gone == set()
    assert Counter(e.stream for e in entries) == {HIGH: 1, LOW: 2}
    # Reads that may block become one, with the largest count: two of each are left, and
    # the read of one each would have left one.
    entries, _ = await worker.read_checking(
        [StreamRead([HIGH], 1), StreamRead([LOW], 3)], 50, ["here"]
    )
    assert Counter(e.stream for e in entries) == {HIGH: 2, LOW: 2}
    assert len(worker.held(HIGH)) == 5 and len(worker.held(LOW)) == 5
