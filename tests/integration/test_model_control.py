"""Model control for the whole mesh (in-process services, real Redis): only an admin
tenant's key may use it (a gateway without API keys does not start with it), an unload
closes the worker's sessions and deregisters it, a load opens them again, a model copied
into the repository after the start is loadable, a tampered one is refused; and
ModelStatistics sums what two gateways counted."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.conftest import copy_model, copy_repository
from tests.integration.conftest import _start, start_mesh
from tests.polling import until
from tests.tenants import ADMIN, USER, write_tenants
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.exposure import StartRefused
from tiermesh.core.settings import GatewaySettings
from tiermesh.gateway.__main__ import serve as serve_gateway

pytestmark = pytest.mark.integration

X0 = np.arange(16, dtype=np.int32).reshape(1, 16)
X1 = np.full((1, 16), 3, dtype=np.int32)
FAST = {"model_control_refresh_ms": 50, "statistics_flush_ms": 50}


def inputs(a: np.ndarray, b: np.ndarray) -> list[aioclient.InferInput]:
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        inp = aioclient.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
        inp.set_data_from_numpy(x)
        out.append(inp)
    return out


async def check_sums(
    client: aioclient.InferenceServerClient, model: str, headers: dict[str, str] = ADMIN
) -> None:
    result = await client.infer(model, inputs(X0, X1), headers=headers)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X0 + X1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), X0 - X1)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def loaded_gauge(metrics: str, model: str) -> float | None:
    """tiermesh_worker_model_loaded of `model` (version 1, fp32, center)."""
    labels = f'model="{model}",tier="center",variant="fp32",version="1"'
    for line in metrics.splitlines():
        if line.startswith("tiermesh_worker_model_loaded{"):
            got = ",".join(sorted(line[line.index("{") + 1 : line.index("}")].split(",")))
            if got == labels:
                return float(line.rsplit(" ", 1)[1])
    return None


async def test_load_and_unload_reach_the_workers(redis_url: str, tmp_path: Path) -> None:
    repo = copy_repository(tmp_path / "models")
    tenants = write_tenants(tmp_path / "tenants.yaml")
    # The default refresh (500 ms): what a load returns after must not depend on polling.
    mesh = await start_mesh(
        redis_url, repo, gateway_overrides={"model_control": "explicit", "tenants_file": tenants}
    )
    redis = aioredis.Redis.from_url(redis_url)
    client = aioclient.InferenceServerClient(mesh.gateway)

    async def workers(model: str) -> int:
        unit = ComputeUnit(model, "1", "fp32")
        return int(await redis.zcard(keys.workers_key(unit, "center")))

    try:
        await check_sums(client, "simple")
        assert await workers("simple") == 1

        # Only the admin's key may: without a key UNAUTHENTICATED, with the user's (who may
        # infer with `simple`) PERMISSION_DENIED; neither changes anything.
        generation = await redis.get(keys.CONTROL_GENERATION)
        for headers, code, says in [
            ({}, "UNAUTHENTICATED", "missing or invalid API key"),
            (USER, "PERMISSION_DENIED", "tenant 'user' may not load or unload models"),
        ]:
            for control in (client.unload_model, client.load_model):
                with pytest.raises(InferenceServerException) as err:
                    await control("simple", headers=headers)
                assert err.value.status() == f"StatusCode.{code}"
                assert says in str(err.value.message())
        assert await redis.get(keys.CONTROL_GENERATION) == generation
        await check_sums(client, "simple", USER)

        # Unload: refused at once, and the worker drops the unit and deregisters.
        await client.unload_model("simple", headers=ADMIN)
        assert not await client.is_model_ready("simple", headers=ADMIN)
        with pytest.raises(InferenceServerException) as err:
            await client.infer("simple", inputs(X0, X1), headers=ADMIN)
        assert err.value.status() == "StatusCode.UNAVAILABLE"
        assert "not loaded" in str(err.value.message())

        async def deregistered() -> bool:
            return await workers("simple") == 0

        await until(deregistered, "the worker left simple's worker set")
        metrics_url = f"http://127.0.0.1:{mesh.ports['worker']['metrics_port']}/metrics"

        async def session_closed() -> bool:
            return loaded_gauge(await asyncio.to_thread(fetch, metrics_url), "simple") == 0.0

        await until(session_closed, "the worker dropped simple's session")
        index = (await client.get_model_repository_index(headers=ADMIN, as_json=True))["models"]
        entry = next(m for m in index if m["name"] == "simple")
        assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
        assert await workers("mlp") == 1

        # Load: returns once a worker serves it; correct answers again.
        await client.load_model("simple", headers=ADMIN)
        assert await client.is_model_ready("simple", headers=ADMIN)
        assert await workers("simple") == 1
        assert loaded_gauge(fetch(metrics_url), "simple") == 1.0
        await check_sums(client, "simple")

        # A model copied into the folder after the start: loadable and served.
        copy_model(repo, "simple", "simple_new")
        with pytest.raises(InferenceServerException, match="unknown model"):
            await client.infer("simple_new", inputs(X0, X1), headers=ADMIN)
        await client.load_model("simple_new", headers=ADMIN)
        assert await client.is_model_ready("simple_new", headers=ADMIN)
        await check_sums(client, "simple_new")
        index = (await client.get_model_repository_index(headers=ADMIN, as_json=True))["models"]
        assert {"name": "simple_new", "version": "1", "state": "READY"} in index

        # A tampered model: refused with the reason, and nothing changes.
        generation = await redis.get(keys.CONTROL_GENERATION)
        copy_model(repo, "simple", "simple_bad", tamper=True)
        with pytest.raises(InferenceServerException) as err:
            await client.load_model("simple_bad", headers=ADMIN)
        assert "do not match the sha256" in str(err.value.message())
        assert "nothing changed" in str(err.value.message())
        assert await redis.get(keys.CONTROL_GENERATION) == generation
        assert await workers("simple_bad") == 0
        await check_sums(client, "simple")

        # Every control call left an audit entry: who, which operation, with what outcome.
        async def audited() -> list[tuple[str, str, str, str]]:
            entries = [f for _, f in await redis.xrange(keys.AUDIT_STREAM)]
            return [
                (
                    e[b"operation"].decode(),
                    e[b"tenant"].decode(),
                    e[b"model"].decode(),
                    e[b"outcome"].decode(),
                )
                for e in entries
                if e[b"operation"] != b"infer"
            ]

        async def the_last_is_audited() -> bool:
            return any(e[:3] == ("load", "ops", "simple_bad") for e in await audited())

        await until(the_last_is_audited, "the refused load of simple_bad is audited")
        control = await audited()
        assert ("unload", "-", "simple", "UNAUTHENTICATED") in control
        assert ("unload", "user", "simple", "PERMISSION_DENIED") in control
        assert ("unload", "ops", "simple", "OK") in control
        assert ("load", "ops", "simple_new", "OK") in control
    finally:
        await client.close()
        await redis.aclose()
        await mesh.close()


def _gateway_settings(redis_url: str, repo: Path, **overrides: Any) -> GatewaySettings:
    return GatewaySettings(
        redis_url=redis_url,
        model_repository=repo,
        shutdown_grace_s=5,
        metrics_port=0,
        gateway_port=0,
        delivery_port=0,
        http_port=-1,
        **overrides,
    )


async def test_explicit_control_without_api_keys_does_not_start(
    redis_url: str, model_repo: Path
) -> None:
    """Refused before anything listens or Redis is asked (the one for this gateway answers
    nothing: a port where nothing listens)."""
    nowhere = redis_url.rsplit(":", 1)[0] + ":1/0"
    settings = _gateway_settings(nowhere, model_repo, model_control="explicit")
    with pytest.raises(StartRefused, match="TIERMESH_MODEL_CONTROL=explicit needs API keys"):
        await serve_gateway(settings, asyncio.Event())


def test_the_gateway_process_says_why_in_one_line_and_exits_2(model_repo: Path) -> None:
    env = {
        **os.environ,
        "TIERMESH_MODEL_CONTROL": "explicit",
        "TIERMESH_MODEL_REPOSITORY": str(model_repo),
        "TIERMESH_LOG_FORMAT": "console",
    }
    env.pop("TIERMESH_TENANTS_FILE", None)
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.gateway"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "gateway not started" in lines[0]
    assert "TIERMESH_MODEL_CONTROL=explicit needs API keys" in lines[0]


async def test_statistics_sum_what_every_gateway_counted(redis_url: str, tmp_path: Path) -> None:
    repo = copy_repository(tmp_path / "models")
    mesh = await start_mesh(redis_url, repo, common_overrides=FAST)
    try:
        second = await _start(
            mesh,
            "gateway-2",
            serve_gateway,
            _gateway_settings(redis_url, repo, router_address=mesh.router, **FAST),
            mesh.exporter,
        )
        clients = [
            aioclient.InferenceServerClient(mesh.gateway),
            aioclient.InferenceServerClient(f"127.0.0.1:{second['port']}"),
        ]
        try:
            for _ in range(3):
                await check_sums(clients[0], "simple")
            for _ in range(2):
                await check_sums(clients[1], "simple")
            with pytest.raises(InferenceServerException):  # a failure, on the second one
                await clients[1].infer("simple", inputs(X0.astype(np.int64), X1))

            for client in clients:

                async def counted(c: aioclient.InferenceServerClient = client) -> bool:
                    doc = await c.get_inference_statistics("simple", "1", as_json=True)
                    stats = doc["model_stats"][0]
                    inference = stats["inference_stats"]
                    return (
                        int(inference["success"].get("count", 0)) == 5
                        and int(inference["fail"].get("count", 0)) == 1
                        and int(stats.get("inference_count", 0)) == 5
                    )

                await until(counted, "both gateways' requests are counted by either")
            doc = await clients[0].get_inference_statistics("simple", "1", as_json=True)
            stats = doc["model_stats"][0]
            executions = int(stats["execution_count"])
            assert 1 <= executions <= 5
            batches = stats["batch_stats"]
            assert sum(int(b["compute_infer"]["count"]) for b in batches) == executions
            assert all(int(b["compute_output"]["ns"]) > 0 for b in batches)
        finally:
            for client in clients:
                await client.close()
    finally:
        await mesh.close()
