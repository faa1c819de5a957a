"""Canary rollouts on a real `tiermesh up`: a canary whose outputs are wrong, and one that
fails every request, are rolled back automatically within their window while every
stable-routed request is answered OK (by the stable version's weights).

Each case starts the rollout with the CLI at 20%, drives closed-loop load where every
request carries a fresh `sticky_key` (so the test knows, with the router's own hash, which
requests were the canary's), waits for the controller's auto-rollback in the change log,
then for the routers to send nothing more to the canary. Printed per case: the time from
the first bad canary answer to the rollback, and how many requests reached the canary
(callers' and mirrored copies)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.conftest import DRIFTING, FAILING, GOOD
from tests.e2e.conftest import UpProcess, report_figures, start_up
from tests.e2e.load import Callers
from tiermesh.core.redis_client import connect
from tiermesh.rollout.changes import Change
from tiermesh.rollout.split import in_canary
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import window_seconds

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MODEL = "mlp_versions"
PERCENT = 20.0
X = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
# The routers' rollout cache is re-read every second (RouterSettings.rollout_refresh_ms).
REFRESH_S = 1.0


@dataclass(frozen=True, slots=True)
class Call:
    start: float  # time.time(): compared with the change log's wall-clock times
    end: float
    key: str
    code: str
    version: str = ""
    correct: bool = False  # the stable version's output


@dataclass(kw_only=True)
class KeyedLoad(Callers):
    """Closed-loop callers, each request with a fresh sticky key."""

    expected: np.ndarray
    callers: int = 6
    calls: list[Call] = field(default_factory=list)

    async def _caller(self, client: aioclient.InferenceServerClient, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            key = f"user-{i}-{n}-{time.monotonic_ns()}"
            inp = aioclient.InferInput("INPUT0", list(X.shape), "FP32")
            inp.set_data_from_numpy(X)
            start = time.time()
            try:
                resp = await client.infer(
                    MODEL, [inp], parameters={"sticky_key": key}, client_timeout=20
                )
            except InferenceServerException as exc:
                code = str(exc.status()).removeprefix("StatusCode.")
                self.calls.append(Call(start, time.time(), key, code))
                continue
            out = resp.as_numpy("OUTPUT0")
            version = resp.get_response().model_version
            correct = bool(np.allclose(out, self.expected, atol=1e-5))
            self.calls.append(Call(start, time.time(), key, "OK", version, correct))


@pytest.fixture(scope="module")
def rollout_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[UpProcess, Path]]:
    tmp = tmp_path_factory.mktemp("rollout")
    up = start_up(tmp, rollout_model=MODEL, span_files=False)
    try:
        yield up, tmp / "models"
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def cli(up: UpProcess, repo: Path, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", "rollout", *args, MODEL,
         "--redis-url", up.redis_url(), "--repository", str(repo), "--who", "e2e"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


async def wait_for_rollback(url: str, since_ms: int, timeout_s: float) -> Change:
    redis = connect(url)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            for change in await RolloutStore(redis).changes(MODEL, count=5):
                if change.action == "auto-rollback" and change.time_ms >= since_ms:
                    return change
            assert time.monotonic() < deadline, "the canary was never rolled back"
            await asyncio.sleep(0.05)
    finally:
        await redis.aclose()


async def canary_answers(url: str, canary: str, since_ms: int) -> int:
    """Answers of the canary version the gateways recorded (callers' and mirrored)."""
    redis = connect(url)
    try:
        seconds = window_seconds(time.time(), 600, since_ms)
        stats = await RolloutStore(redis).window(MODEL, canary, seconds)
        return stats.answers
    finally:
        await redis.aclose()


def wait_for_stable_calls(load: KeyedLoad, after: float, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(c.start >= after for c in list(load.calls)) < n:
        assert time.monotonic() < deadline, "no calls after the rollback"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("canary", "reason", "bad"),
    [(DRIFTING, "drift", "wrong outputs"), (FAILING, "error_rate", "errors")],
    ids=["wrong-outputs", "errors"],
)
def test_bad_canary_is_rolled_back_while_stable_traffic_is_served(
    rollout_up: tuple[UpProcess, Path],
    canary: str,
    reason: str,
    bad: str,
    capsys: pytest.CaptureFixture[str],
    record_property: Any,
    tmp_path: Path,
) -> None:
    up, repo = rollout_up
    expected = np.asarray(
        ort.InferenceSession(str(repo / MODEL / GOOD / "model.onnx")).run(None, {"INPUT0": X})[0]
    )
    started = time.time()
    with KeyedLoad(up.url, expected=expected) as load:
        print(cli(up, repo, "start", "--canary", canary, "--percent", str(PERCENT)))
        change = asyncio.run(wait_for_rollback(up.redis_url(), int(started * 1000), 30))
        rolled_back = change.time_ms / 1000
        # The routers drop the canary within one refresh of their rollout cache.
        settled = rolled_back + REFRESH_S + 0.5
        wait_for_stable_calls(load, settled, 30, timeout_s=30)
    calls = list(load.calls)
    status = cli(up, repo, "status")
    assert (change.reason, change.canary, change.state, change.percent) == (
        reason,
        canary,
        "rolled_back",
        0.0,
    )
    on_canary = [c for c in calls if in_canary(MODEL, canary, c.key, PERCENT)]
    on_stable = [c for c in calls if not in_canary(MODEL, canary, c.key, PERCENT)]
    # Every stable-routed request: OK, version 1, the stable weights' output.
    wrong = [c for c in on_stable if (c.code, c.version, c.correct) != ("OK", GOOD, True)]
    assert not wrong, f"{len(wrong)} stable-routed requests went wrong, e.g. {wrong[:3]}"
    # What the canary answered callers before the rollback was bad; nothing after.
    served_by_canary = [c for c in on_canary if c.version == canary or c.code != "OK"]
    assert served_by_canary, "no caller reached the canary"
    assert all(not c.correct for c in served_by_canary)
    assert not [c for c in calls if c.start >= settled and (c.version, c.code) != (GOOD, "OK")]
    first_bad = min(c.end for c in served_by_canary)
    breach_to_rollback_s = rolled_back - first_bad
    window_s = 10.0  # CANARY_SETTINGS in tests/conftest.py
    assert 0 < breach_to_rollback_s < window_s, breach_to_rollback_s
    reached = asyncio.run(canary_answers(up.redis_url(), canary, int(started * 1000)))
    figures = {
        "canary": f"{canary} ({bad})",
        "reason": change.reason,
        "breach_to_rollback_s": round(breach_to_rollback_s, 2),
        "callers_on_canary": len(served_by_canary),
        "canary_answers_incl_mirrored": reached,
        "stable_routed": len(on_stable),
        "stable_errors": 0,
        "calls": len(calls),
    }
    row = report_figures(f"rollout-{reason}", figures, tmp_path / "figures.json", record_property)
    with capsys.disabled():
        print(f"\n{row}\n{change.detail}\n{status}")
