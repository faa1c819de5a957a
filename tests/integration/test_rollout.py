"""Versions and canary rollouts against a real redis-server: per-version compute in the
in-process mesh, the rollout state and change log round trip, the controller's rollback,
and the gateway's per-version observations (outcomes, mirrored drift)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from tests.conftest import DRIFTING, FAILING, GOOD, copy_repository
from tests.integration.conftest import InProcessMesh, start_mesh
from tests.polling import until
from tiermesh.core import keys
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.rollout.commands import Rollouts
from tiermesh.rollout.controller import RolloutController
from tiermesh.rollout.metrics import RolloutMetrics
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import WindowCounts, window_seconds

pytestmark = pytest.mark.integration
MODEL = "mlp_versions"
X = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)


@pytest.fixture(scope="module")
def versioned_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_repository(tmp_path_factory.mktemp("models"), rollout_model=MODEL)


@pytest.fixture(scope="module")
def configs(versioned_repo: Path) -> dict[str, ModelConfig]:
    return ModelRepository(versioned_repo).load()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def versioned_mesh(redis_url: str, versioned_repo: Path) -> AsyncIterator[InProcessMesh]:
    # Routers re-read rollout states every 50 ms here, so a test sees a change quickly.
    mesh = await start_mesh(redis_url, versioned_repo, common_overrides={"rollout_refresh_ms": 50})
    try:
        yield mesh
    finally:
        await mesh.close()


def direct(repo: Path, version: str) -> np.ndarray:
    """What onnxruntime itself computes for X with the version's file."""
    path = repo / MODEL / version / "model.onnx"
    return np.asarray(ort.InferenceSession(str(path)).run(None, {"INPUT0": X})[0])


async def infer(
    client: aioclient.InferenceServerClient, version: str = "", **params: str
) -> tuple[str, np.ndarray]:
    inp = aioclient.InferInput("INPUT0", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    resp = await client.infer(MODEL, [inp], model_version=version, parameters=params or None)
    return resp.get_response().model_version, resp.as_numpy("OUTPUT0")


async def test_a_request_naming_a_version_is_computed_by_that_version(
    versioned_mesh: InProcessMesh, versioned_repo: Path
) -> None:
    v1, v2 = direct(versioned_repo, GOOD), direct(versioned_repo, DRIFTING)
    assert not np.allclose(v1, v2)  # the fixture's versions really differ
    client = aioclient.InferenceServerClient(versioned_mesh.gateway)
    try:
        version, out = await infer(client, GOOD)
        assert version == GOOD and np.allclose(out, v1, atol=1e-5)
        version, out = await infer(client, DRIFTING)
        assert version == DRIFTING and np.allclose(out, v2, atol=1e-5)
        # Unnamed: the config's stable_version (1), although 3 is the latest.
        version, out = await infer(client)
        assert version == GOOD and np.allclose(out, v1, atol=1e-5)
    finally:
        await client.close()


async def test_rollout_state_and_change_log_round_trip(
    redis: aioredis.Redis, configs: dict[str, ModelConfig]
) -> None:
    now = [1_000_000.0]
    rollouts = Rollouts(RolloutStore(redis), configs, "ana", clock=lambda: now[0])
    started = await rollouts.start(MODEL, DRIFTING, 25)
    assert await RolloutStore(redis).state(MODEL) == started
    now[0] += 60
    promoted = await rollouts.promote(MODEL)
    assert (promoted.state, promoted.stable, promoted.percent) == ("promoted", DRIFTING, 100.0)
    status = await rollouts.status(MODEL)
    assert status.state == promoted and status.stable == DRIFTING
    assert [(c.action, c.who, c.state) for c in status.changes] == [
        ("promote", "ana", "promoted"),
        ("start", "ana", "running"),
    ]
    start = status.changes[1]
    assert (start.stable, start.canary, start.percent, start.time_ms) == (
        GOOD,
        DRIFTING,
        25.0,
        1_000_000_000,
    )
    assert len(start.canary_sha256) == 64 and start.canary_sha256 != start.stable_sha256
    # Every change is an entry of the one change-log stream.
    assert await redis.xlen(keys.CHANGE_LOG) == 2


async def test_controller_rolls_back_a_breaching_canary_once(
    redis: aioredis.Redis, configs: dict[str, ModelConfig]
) -> None:
    now = [2_000_000.0]
    store = RolloutStore(redis)
    await Rollouts(store, configs, "ana", clock=lambda: now[0]).start(MODEL, FAILING, 20)
    registry = CollectorRegistry()
    metrics = RolloutMetrics(registry)
    clock = lambda: now[0]  # noqa: E731
    leader = RolloutController(store, configs, "router-a", metrics, clock=clock)
    other = RolloutController(store, configs, "router-b", RolloutMetrics(CollectorRegistry()))
    # Too little data: nothing happens.
    counts = WindowCounts()
    second = int(now[0])
    for _ in range(30):
        counts.outcome(MODEL, GOOD, second, "OK", 1.0)
    for _ in range(5):
        counts.outcome(MODEL, FAILING, second, "ABORTED", 1.0)
    await store.flush(*counts.drain())
    [evaluation] = await leader.evaluate_once()
    assert evaluation.verdict.action == "insufficient_data" and not evaluation.rolled_back
    # The other router does not evaluate while the leader holds the lock.
    assert await other.evaluate_once() == []
    now[0] += 1
    for _ in range(6):
        counts.outcome(MODEL, FAILING, int(now[0]), "ABORTED", 1.0)
    await store.flush(*counts.drain())
    [evaluation] = await leader.evaluate_once()
    assert evaluation.rolled_back and evaluation.verdict.reason == "error_rate"
    state = await store.state(MODEL)
    assert state is not None and (state.state, state.percent) == ("rolled_back", 0.0)
    [change, *_] = await store.changes(MODEL)
    assert (change.action, change.who, change.reason) == (
        "auto-rollback",
        "controller",
        "error_rate",
    )
    assert change.time_ms == int(now[0] * 1000)
    labels = {"model": MODEL, "reason": "error_rate"}
    assert registry.get_sample_value("tiermesh_rollout_rollbacks_total", labels) == 1
    assert registry.get_sample_value("tiermesh_rollout_canary_percent", {"model": MODEL}) == 0
    # Nothing left to judge: the next round rolls nothing back again.
    assert await leader.evaluate_once() == []


async def test_gateway_records_outcomes_per_version_and_drift_of_mirrored_requests(
    versioned_mesh: InProcessMesh, redis: aioredis.Redis, configs: dict[str, ModelConfig]
) -> None:
    """A running rollout of the drifting version at 0%: every request is answered by
    stable, half of them are mirrored to the canary, and the pairs' cosine lands in the
    canary's window; answers named by version count for that version."""
    store = RolloutStore(redis)
    state = await Rollouts(store, configs, "ana").start(MODEL, DRIFTING, 0)
    client = aioclient.InferenceServerClient(versioned_mesh.gateway)
    try:
        deadline = time.monotonic() + 30
        while True:  # until the routers' cache has the rollout and pairs were compared
            version, _ = await infer(client, sticky_key="k")
            assert version == GOOD
            seconds = window_seconds(time.time(), 60, state.started_ms)
            canary = await store.window(MODEL, DRIFTING, seconds)
            if canary.cosine_n >= 3:
                break
            assert time.monotonic() < deadline, f"no drift recorded: {canary}"
        with pytest.raises(InferenceServerException) as failed:
            await infer(client, FAILING)
        assert failed.value.status() == "StatusCode.ABORTED"
    finally:
        await client.close()
    assert canary.cosine_mean is not None and canary.cosine_mean < 0.99
    assert canary.ok >= 3  # shadow answers count as the canary's

    async def failure_recorded() -> bool:
        # The window as of now: the failing call may have landed in a later second.
        now_seconds = window_seconds(time.time(), 60, state.started_ms)
        return (await store.window(MODEL, FAILING, now_seconds)).errors >= 1

    await until(failure_recorded, "the failing version's answer to be recorded", 10)
    stable = await store.window(MODEL, GOOD, window_seconds(time.time(), 60))
    assert stable.ok >= 3 and stable.errors == 0 and stable.p99_ms() is not None
