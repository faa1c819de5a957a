"""The gateway's response cache against a real redis-server: hits, misses, TTL, the bound,
tenant isolation, and a Redis that is not there."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from typing import cast

import grpc
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tiermesh.core import keys
from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.model_config import CacheSpec
from tiermesh.core.tensors import TensorData
from tiermesh.gateway.cache import AnswerCache, cache_digest
from tiermesh.up.processes import free_port

pytestmark = pytest.mark.integration

MODEL = "mlp"
SPEC = CacheSpec(enabled=True, ttl_s=60.0, max_entries=100)
X = TensorData("x", "FP32", (1, 2), struct.pack("<2f", 0.5, -1.5))


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def digest_for(n: int, tenant: str | None = "t1") -> str:
    x = TensorData("x", "FP32", (1, 1), struct.pack("<f", float(n)))
    return cache_digest(MODEL, "1", "fp32", tenant, [x], ["y"])


def answer(n: float = 1.0, **fields: object) -> JobResult:
    base: dict[str, object] = dict(
        request_id="req-1",
        model=MODEL,
        gateway="127.0.0.1:9000",
        outputs=(TensorData("y", "FP32", (1, 2), struct.pack("<2f", n, n * 2)),),
        client_request_id="client-7",
        version="1",
        variant="fp32",
        tier="edge",
        priority=1,
        batch_size=4,
        timing=Timing(received_ns=1, routed_ns=2, delivered_ns=3),
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        annotations={"labels": "cat,dog"},
    )
    base.update(fields)
    return JobResult(**base)  # type: ignore[arg-type]


async def index_members(redis: aioredis.Redis, model: str = MODEL) -> list[str]:
    """The index's digests, oldest first."""
    members = cast(list[bytes], await redis.zrange(keys.cache_index_key(model), 0, -1))
    return [m.decode() for m in members]


async def entry_keys(redis: aioredis.Redis, model: str = MODEL) -> set[str]:
    found: set[str] = set()
    async for key in redis.scan_iter(match=keys.cache_entry_prefix(model) + "*", count=100):
        found.add(key.decode())
    return found


async def test_put_then_get_returns_the_answer_only(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    d = cache_digest(MODEL, "1", "fp32", "t1", [X], ["y"])
    stored = answer()
    await cache.put(MODEL, d, stored, SPEC)
    got = await cache.get(MODEL, d)
    assert got is not None
    assert got.outputs == stored.outputs
    assert dict(got.annotations) == {"labels": "cat,dog"}
    assert (got.model, got.version, got.variant) == (MODEL, "1", "fp32")
    assert got.code == grpc.StatusCode.OK
    # Nothing about the request that produced it.
    assert got.request_id == got.client_request_id == got.gateway == got.tier == ""
    assert got.timing == Timing()
    assert dict(got.trace_context) == {}
    assert (got.priority, got.batch_size) == (0, 0)
    assert (cache.hits, cache.misses) == (1, 0)
    assert await index_members(redis) == [d]
    # Scored by insertion time in milliseconds (redis-server runs on this machine's clock).
    score = await redis.zscore(keys.cache_index_key(MODEL), d)
    assert score is not None and abs(score - time.time() * 1000) < 5_000


async def test_misses_count(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    assert await cache.get(MODEL, digest_for(1)) is None
    assert await cache.get("other", digest_for(1)) is None
    await cache.put(MODEL, digest_for(1), answer(), SPEC)
    assert await cache.get(MODEL, digest_for(1)) is not None
    # Same digest under another model is a different entry.
    assert await cache.get("other", digest_for(1)) is None
    assert (cache.hits, cache.misses, cache.errors) == (1, 3, 0)


async def test_entry_expires_by_ttl_and_leaves_the_index(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    spec = CacheSpec(enabled=True, ttl_s=0.2, max_entries=10)
    await cache.put(MODEL, digest_for(1), answer(), spec)
    pttl = await redis.pttl(keys.cache_entry_key(MODEL, digest_for(1)))
    assert 0 < pttl <= 200
    assert 0 < await redis.pttl(keys.cache_index_key(MODEL)) <= 200
    assert await cache.get(MODEL, digest_for(1)) is not None

    deadline = time.monotonic() + 5.0
    while await cache.get(MODEL, digest_for(1)) is not None:
        assert time.monotonic() < deadline, "entry outlived its TTL"
        await asyncio.sleep(0.02)

    # The next write drops the expired digest from the index.
    await cache.put(
        MODEL, digest_for(2), answer(), CacheSpec(enabled=True, ttl_s=60, max_entries=10)
    )
    assert await index_members(redis) == [digest_for(2)]
    assert await entry_keys(redis) == {keys.cache_entry_key(MODEL, digest_for(2))}


async def test_shorter_ttl_drops_entries_written_with_a_longer_one(redis: aioredis.Redis) -> None:
    # After a config change an entry older than the new TTL goes, key and index member both.
    cache = AnswerCache(redis)
    await cache.put(MODEL, digest_for(1), answer(), SPEC)
    await cache.put(MODEL, digest_for(2), answer(), CacheSpec(enabled=True, ttl_s=0.05))
    # The index lives as long as its longest-lived answer.
    assert await redis.pttl(keys.cache_index_key(MODEL)) > 1000
    deadline = time.monotonic() + 5.0
    while await redis.exists(keys.cache_entry_key(MODEL, digest_for(2))):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await cache.put(MODEL, digest_for(3), answer(), CacheSpec(enabled=True, ttl_s=0.05))
    assert await entry_keys(redis) == {keys.cache_entry_key(MODEL, digest_for(3))}
    assert await redis.zcard(keys.cache_index_key(MODEL)) == 1


async def test_bound_keeps_the_newest(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    spec = CacheSpec(enabled=True, ttl_s=60.0, max_entries=10)
    index = keys.cache_index_key(MODEL)
    for n in range(50):
        await cache.put(MODEL, digest_for(n), answer(float(n)), spec)
        assert await redis.zcard(index) == min(n + 1, 10)
    newest = [digest_for(n) for n in range(40, 50)]
    assert await redis.zcard(index) == 10
    assert await index_members(redis) == newest
    assert await entry_keys(redis) == {keys.cache_entry_key(MODEL, d) for d in newest}
    for n in range(40, 50):
        got = await cache.get(MODEL, digest_for(n))
        assert got is not None and got.outputs == answer(float(n)).outputs
    assert await cache.get(MODEL, digest_for(39)) is None


async def test_bound_holds_under_concurrent_writes(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    spec = CacheSpec(enabled=True, ttl_s=60.0, max_entries=10)
    await asyncio.gather(*(cache.put(MODEL, digest_for(n), answer(), spec) for n in range(200)))
    assert await redis.zcard(keys.cache_index_key(MODEL)) == 10
    members = set(await index_members(redis))
    assert await entry_keys(redis) == {keys.cache_entry_key(MODEL, d) for d in members}


async def test_models_are_bounded_separately(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    spec = CacheSpec(enabled=True, ttl_s=60.0, max_entries=3)
    for n in range(5):
        await cache.put("a", digest_for(n), answer(), spec)
        await cache.put("b", digest_for(n), answer(), spec)
    assert len(await entry_keys(redis, "a")) == 3
    assert len(await entry_keys(redis, "b")) == 3


async def test_tenants_do_not_share_unless_the_digest_says_so(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    mine = cache_digest(MODEL, "1", "fp32", "t1", [X], ["y"])
    theirs = cache_digest(MODEL, "1", "fp32", "t2", [X], ["y"])
    shared = cache_digest(MODEL, "1", "fp32", None, [X], ["y"])
    await cache.put(MODEL, mine, answer(), SPEC)
    assert await cache.get(MODEL, mine) is not None
    assert await cache.get(MODEL, theirs) is None
    assert await cache.get(MODEL, shared) is None
    await cache.put(MODEL, shared, answer(3.0), SPEC)
    got = await cache.get(MODEL, cache_digest(MODEL, "1", "fp32", None, [X], ["y"]))
    assert got is not None and got.outputs == answer(3.0).outputs


async def test_failed_or_disabled_results_are_not_stored(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    failed = answer(code=grpc.StatusCode.INVALID_ARGUMENT, message="bad", outputs=())
    await cache.put(MODEL, digest_for(1), failed, SPEC)
    await cache.put(MODEL, digest_for(2), answer(code=grpc.StatusCode.DEADLINE_EXCEEDED), SPEC)
    await cache.put(MODEL, digest_for(3), answer(), CacheSpec(enabled=False))
    assert await redis.dbsize() == 0
    assert await cache.get(MODEL, digest_for(1)) is None
    assert cache.errors == 0


async def test_corrupt_entry_is_a_miss(redis: aioredis.Redis) -> None:
    cache = AnswerCache(redis)
    await redis.set(keys.cache_entry_key(MODEL, digest_for(1)), b"\xff\xff\xff not a proto")
    assert await cache.get(MODEL, digest_for(1)) is None
    assert (cache.hits, cache.misses, cache.errors) == (0, 1, 1)


async def test_unreachable_redis_is_a_miss_and_a_skipped_write() -> None:
    client = aioredis.Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    cache = AnswerCache(client)
    try:
        assert await cache.get(MODEL, digest_for(1)) is None
        await cache.put(MODEL, digest_for(1), answer(), SPEC)
        assert (cache.hits, cache.misses, cache.errors) == (0, 1, 2)
    finally:
        await client.aclose()
