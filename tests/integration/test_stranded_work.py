"""Work stranded on a tier whose workers all died is moved to a live tier by the router
(router/stranded.py): on a real redis-server, with mlp_cascade (edge and center tiers)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from tests.conftest import copy_repository
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job
from tiermesh.core.keys import StreamKey
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository
from tiermesh.core.tier_spec import TierSpec
from tiermesh.core.wire import decode_job, encode_job
from tiermesh.router.stranded import StrandedWork, rescue_tier

pytestmark = pytest.mark.integration

MODEL = "mlp_cascade"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    repo = ModelRepository(copy_repository(Path(tmp_path_factory.mktemp("models"))))
    repo.load()
    return repo.configs[MODEL]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def stream(cfg: ModelConfig, tier: str, priority: int = 1, bucket: int = 0) -> StreamKey:
    spec = next(t for t in cfg.tiers if t.name == tier)
    unit = ComputeUnit(cfg.queue_model, "1", spec.variant or cfg.default_variant)
    return StreamKey(unit, tier, priority, bucket)


async def live(redis: aioredis.Redis, s: StreamKey, alive: bool) -> None:
    expiry = int(time.time() * 1000) + (60_000 if alive else -1)
    await redis.zadd(keys.workers_key(s.unit, s.tier), {f"w-{s.tier}": expiry})


async def queue(redis: aioredis.Redis, s: StreamKey, request_id: str) -> None:
    job = Job(request_id, MODEL, (), "gw:1", tier=s.tier, priority=s.priority)
    await redis.xadd(
        s.name,
        {
            keys.JOB_FIELD: encode_job(job),
            keys.TRACEPARENT_FIELD: f"tp-{request_id}",
            keys.TRACESTATE_FIELD: "",
        },
    )


def test_the_last_live_tier_takes_a_dead_tiers_work() -> None:
    tiers = [TierSpec("edge", "int8", 64), TierSpec("center", "fp32")]
    assert rescue_tier(tiers, "edge", {"center"}) is tiers[1]
    assert rescue_tier(tiers, "center", {"edge"}) is tiers[0]  # nothing heavier lives
    assert rescue_tier(tiers, "edge", {"edge"}) is None
    assert rescue_tier(tiers, "edge", set()) is None


async def test_a_dead_edges_entries_move_to_center_once(
    redis: aioredis.Redis, cfg: ModelConfig
) -> None:
    edge, center = stream(cfg, "edge"), stream(cfg, "center")
    background = stream(cfg, "edge", keys.BACKGROUND_PRIORITY, 0)
    for s in (edge, center, background):
        await redis.xgroup_create(s.name, keys.GROUP, id="0", mkstream=True)
    await live(redis, edge, False)
    await live(redis, center, True)
    await queue(redis, edge, "r1")
    await queue(redis, edge, "r2")
    await queue(redis, background, "r3")
    # r1 was read by the edge worker that died: pending, never acknowledged.
    await redis.xreadgroup(keys.GROUP, "w-edge", {edge.name: ">"}, count=1)

    movers = [StrandedWork(redis, {MODEL: cfg}) for _ in range(2)]
    moved = await asyncio.gather(*(m.round() for m in movers))  # two routers at once
    assert sum(moved) == 3
    assert await redis.xlen(edge.name) == await redis.xlen(background.name) == 0
    assert (await redis.xpending(edge.name, keys.GROUP))["pending"] == 0
    entries = await redis.xrange(center.name)
    jobs = [decode_job(f[keys.JOB_FIELD.encode()]) for _, f in entries]
    assert [j.request_id for j in jobs] == ["r1", "r2"]
    assert {(j.tier, j.variant) for j in jobs} == {("center", cfg.default_variant)}
    assert [f[keys.TRACEPARENT_FIELD.encode()] for _, f in entries] == [b"tp-r1", b"tp-r2"]
    background_center = stream(cfg, "center", keys.BACKGROUND_PRIORITY, 0)
    assert await redis.xlen(background_center.name) == 1  # batch work keeps its level
    assert sum(m.moved.labels(MODEL, "edge", "center")._value.get() for m in movers) == 3
    assert await movers[0].round() == 0  # nothing left


async def test_nothing_moves_while_the_tier_lives_or_no_other_does(
    redis: aioredis.Redis, cfg: ModelConfig
) -> None:
    edge, center = stream(cfg, "edge"), stream(cfg, "center")
    await queue(redis, edge, "r1")
    mover = StrandedWork(redis, {MODEL: cfg})
    await live(redis, edge, True)
    await live(redis, center, True)
    assert await mover.round() == 0
    await live(redis, edge, False)
    await live(redis, center, False)
    assert await mover.round() == 0
    assert await redis.xlen(edge.name) == 1
    await live(redis, center, True)  # center comes: now it moves
    assert await mover.round() == 1
