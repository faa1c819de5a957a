"""kill -9 a worker mid-batch under load: another worker of its tier takes over what it had
read, every request is answered once, none is lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, _environ, gateway_counts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECOVERY_ENV = {
    "TIERMESH_RECLAIM_MIN_IDLE_MS": "1000",
    "TIERMESH_RECLAIM_INTERVAL_MS": "200",
    "TIERMESH_HEARTBEAT_TTL_MS": "3000",
}


def spare_worker(like: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Another center worker with the same settings (its own ports and consumer name)."""
    env = dict(like)
    env.update(
        TIERMESH_WORKER_HEALTH_PORT="0", TIERMESH_METRICS_PORT="0", TIERMESH_LOG_FORMAT="json"
    )
    return subprocess.Popen(
        [sys.executable, "-m", "tiermesh.worker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def test_kill_9_a_worker_under_load_loses_nothing(
    new_up: Callable[..., UpProcess], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    up = new_up(extra_env=RECOVERY_ENV)
    first = up.children()["worker"]
    settings = _environ(Path(f"/proc/{first}"))
    spares = [spare_worker(settings, tmp_path / "spare0.log")]
    outcomes: list[str] = []
    stop = threading.Event()
    started = threading.Event()

    async def caller(client: aioclient.InferenceServerClient, seed: int) -> None:
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(rng.standard_normal((1, 4)).astype(np.float32))
            try:
                await client.infer("mlp", [inp], timeout=15_000_000, client_timeout=20)
                outcomes.append("OK")
            except InferenceServerException as exc:
                outcomes.append(str(exc.status()))
            if len(outcomes) > 50:
                started.set()

    async def load() -> None:
        client = aioclient.InferenceServerClient(up.url)
        try:
            await asyncio.gather(*(caller(client, i) for i in range(12)))
        finally:
            await client.close()

    loader = threading.Thread(target=asyncio.run, args=(load(),))
    loader.start()
    kills = []
    try:
        assert started.wait(60)
        victims = [first]
        for round_ in range(2):
            os.kill(victims[-1], signal.SIGKILL)
            kills.append(time.time())
            done = len(outcomes)
            deadline = time.monotonic() + 30
            while len(outcomes) < done + 100:  # traffic keeps flowing on the survivor
                assert time.monotonic() < deadline, "traffic stopped after the kill"
                time.sleep(0.05)
            if round_ == 0:  # next round: a fresh spare, then kill the first spare
                spares.append(spare_worker(settings, tmp_path / "spare1.log"))
                victims.append(spares[0].pid)
                # The new spare must be serving (heartbeat out) before its peer dies.
                deadline = time.monotonic() + 30
                while '"worker serving"' not in (tmp_path / "spare1.log").read_text():
                    assert time.monotonic() < deadline, "the second spare never started"
                    time.sleep(0.05)
    finally:
        stop.set()
        loader.join(timeout=60)
        for p in spares:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
    assert up.interrupt() == 0
    gateway = gateway_counts(up)
    reclaimed = []
    for log in (tmp_path / "spare0.log", tmp_path / "spare1.log"):
        for line in log.read_text().splitlines():
            if '"reclaimed entries of a dead worker"' in line:
                reclaimed.append(json.loads(line))
    lost = [o for o in outcomes if o != "OK"]
    first_reclaim = min(
        (
            datetime.fromisoformat(r["timestamp"].replace("Z", "+00:00")).timestamp()
            for r in reclaimed
        ),
        default=float("nan"),
    )
    with capsys.disabled():
        print(
            f"\nkill -9 x{len(kills)} under load: sent {len(outcomes)}, answered OK "
            f"{outcomes.count('OK')}, lost {len(lost)}, duplicate results suppressed "
            f"{gateway['late_results']}, reclaimed entries {sum(r['n'] for r in reclaimed)}, "
            f"first reclaim {first_reclaim - kills[0]:.2f} s after the first kill "
            f"(min idle {RECOVERY_ENV['TIERMESH_RECLAIM_MIN_IDLE_MS']} ms)"
        )
    assert not lost, lost[:5]
    assert gateway["accepted"] == gateway["answered"] == outcomes.count("OK")
