"""A real worker (in this process, real Redis) and its execution providers: with the default
settings its sessions run on CPU and its metric says so; asked for CUDA on a machine without
it, it refuses to start in one line, or serves on CPU when the fallback allows it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tiermesh.core.sessions import CPU, ProviderUnavailable
from tiermesh.core.settings import WorkerSettings
from tiermesh.worker.__main__ import serve

pytestmark = pytest.mark.integration


def worker_settings(redis_url: str, repo: Path, **overrides: Any) -> WorkerSettings:
    return WorkerSettings(
        redis_url=redis_url,
        model_repository=repo,
        worker_models="mlp",
        worker_health_port=0,
        metrics_port=0,
        shutdown_grace_s=5,
        **overrides,
    )


async def session_providers(settings: WorkerSettings) -> dict[str, str]:
    """Start a worker, read tiermesh_worker_session_info (unit -> provider), stop it."""
    ready: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, ready=ready.set_result))
    try:
        done, _ = await asyncio.wait({ready, task}, timeout=30, return_when="FIRST_COMPLETED")
        if task in done:
            task.result()  # raises why it did not start
        assert ready in done, "the worker did not become ready"
        url = f"http://127.0.0.1:{ready.result()['metrics_port']}/metrics"
        text = await asyncio.to_thread(_fetch, url)
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 30)
    return {
        f"{s.labels['model']}@{s.labels['version']}.{s.labels['variant']}": s.labels["provider"]
        for family in text_string_to_metric_families(text)
        if family.name == "tiermesh_worker_session_info"
        for s in family.samples
        if s.value == 1
    }


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


async def test_a_worker_with_default_settings_serves_on_cpu_and_says_so(
    redis_url: str, model_repo: Path
) -> None:
    assert await session_providers(worker_settings(redis_url, model_repo)) == {"mlp@1.fp32": CPU}


async def test_a_worker_asked_for_cuda_without_it_refuses_or_falls_back(
    redis_url: str, model_repo: Path
) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: nothing to refuse")
    asked = worker_settings(redis_url, model_repo, execution_providers="cuda")
    with pytest.raises(ProviderUnavailable, match="TIERMESH_PROVIDER_FALLBACK=cpu"):
        await session_providers(asked)
    fallback = worker_settings(
        redis_url, model_repo, execution_providers="cuda", provider_fallback="cpu"
    )
    assert await session_providers(fallback) == {"mlp@1.fp32": CPU}


def test_the_worker_process_refuses_in_one_line(redis_url: str, model_repo: Path) -> None:
    """`python -m tiermesh.worker`, as `tiermesh up` starts it: one line, no traceback."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA: nothing to refuse")
    env = {
        **os.environ,
        "TIERMESH_REDIS_URL": redis_url,
        "TIERMESH_MODEL_REPOSITORY": str(model_repo),
        "TIERMESH_WORKER_MODELS": "mlp",
        "TIERMESH_WORKER_HEALTH_PORT": "0",
        "TIERMESH_METRICS_PORT": "0",
        "TIERMESH_EXECUTION_PROVIDERS": "cuda",
    }
    env.pop("TIERMESH_PROVIDER_FALLBACK", None)
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.worker"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            "tiermesh worker: cannot start: execution provider CUDAExecutionProvider is not "
            "available in this onnxruntime"
        )
    ), done.stderr
