"""The execution provider each live worker's session got, from its heartbeat to ModelConfig's
`execution_providers_live`: the key a heartbeat writes (bounded by the heartbeat's TTL,
dropped on leave), the gateway's read of it against a real redis-server, and the whole mesh
answering ModelConfig on both doors."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient

from tests.conftest import MODELS
from tests.integration.conftest import start_mesh
from tiermesh.core import keys
from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.repository import ModelRepository
from tiermesh.gateway.live_providers import EXECUTION_PROVIDERS_LIVE, LiveProviders
from tiermesh.worker.streams import StreamClient

pytestmark = pytest.mark.integration

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
UNIT = ComputeUnit("mlp", "1", "fp32")
TTL_MS = 60_000


def _repo(root: Path) -> Path:
    """The committed mlp config with its weights built here."""
    (root / "mlp" / "1").mkdir(parents=True)
    shutil.copy(MODELS / "mlp" / "config.yaml", root / "mlp" / "config.yaml")
    (root / "mlp" / "1" / "model.onnx").write_bytes(build_mlp())
    return root


async def test_a_heartbeat_publishes_providers_within_its_ttl(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        worker = StreamClient(redis, "w1")
        # `other@1.fp32` has no session yet: it beats without a provider.
        other = ComputeUnit.parse("other@1.fp32")
        await worker.heartbeat([UNIT, other], "edge", TTL_MS, {UNIT: CPU})
        assert await redis.get(keys.provider_key(UNIT, "edge", "w1")) == CPU
        assert 0 < await redis.pttl(keys.provider_key(UNIT, "edge", "w1")) <= TTL_MS
        assert not await redis.exists(keys.provider_key(other, "edge", "w1"))
        await StreamClient(redis, "w2").heartbeat([UNIT], "edge", TTL_MS, {UNIT: CUDA})
        await worker.leave([UNIT, other], "edge")
        assert not await redis.exists(keys.provider_key(UNIT, "edge", "w1"))
        assert await redis.get(keys.provider_key(UNIT, "edge", "w2")) == CUDA
    finally:
        await redis.aclose()


async def test_only_live_members_are_counted(redis_url: str, tmp_path: Path) -> None:
    cfg = ModelRepository(_repo(tmp_path)).load()["mlp"]
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await StreamClient(redis, "w1").heartbeat([UNIT], "center", TTL_MS, {UNIT: CPU})
        await StreamClient(redis, "w2").heartbeat([UNIT], "center", TTL_MS, {UNIT: CUDA})
        # w3's heartbeat expired a moment ago; its key has not yet.
        await redis.zadd(keys.workers_key(UNIT, "center"), {"w3": int(time.time() * 1000) - 1})
        await redis.set(keys.provider_key(UNIT, "center", "w3"), CPU, px=TTL_MS)
        # w4 is live but published no provider (its session is not loaded yet).
        await StreamClient(redis, "w4").heartbeat([UNIT], "center", TTL_MS)
        assert await LiveProviders(redis).read(cfg) == {"center": {CPU: 1, CUDA: 1}}
        # A clock past every heartbeat's expiry: nobody is live.
        later = LiveProviders(redis, clock_ms=lambda: time.time() * 1000 + 2 * TTL_MS)
        assert await later.read(cfg) == {"center": {}}
    finally:
        await redis.aclose()


async def test_an_unreadable_redis_gives_no_counts(redis_url: str, tmp_path: Path) -> None:
    cfg = ModelRepository(_repo(tmp_path)).load()["mlp"]
    nowhere = aioredis.Redis.from_url(redis_url.rsplit(":", 1)[0] + ":1/0")
    try:
        assert await LiveProviders(nowhere).read(cfg) is None
    finally:
        await nowhere.aclose()


async def _live_on_grpc(client: aioclient.InferenceServerClient) -> dict[str, dict[str, int]]:
    """ModelConfig's counts once the worker's first heartbeat shows (a deadline, no sleep:
    each call waits for its answer)."""
    deadline = time.monotonic() + 10
    while True:
        params = (await client.get_model_config("mlp")).config.parameters
        live = json.loads(params[EXECUTION_PROVIDERS_LIVE].string_value)
        if live.get("center") or time.monotonic() > deadline:
            return dict(live)


async def test_model_config_shows_the_provider_the_worker_got(
    redis_url: str, tmp_path: Path
) -> None:
    mesh = await start_mesh(redis_url, _repo(tmp_path))
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        assert await _live_on_grpc(client) == {"center": {CPU: 1}}
        http = f"http://127.0.0.1:{mesh.ports['gateway']['http_port']}"
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{http}/v2/models/mlp/config") as response,
        ):
            assert response.status == 200
            doc = await response.json()
        live = doc["parameters"][EXECUTION_PROVIDERS_LIVE]["string_value"]
        assert json.loads(live) == {"center": {CPU: 1}}
    finally:
        await client.close()
        await mesh.close()
