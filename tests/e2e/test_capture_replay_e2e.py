"""Capture while bench sends a known mix, export, replay: the replay sends the same mix
(size and priority histograms within 2%) and reproduces throughput and p50/p99 within the
run-to-run noise measured here (two replays of one capture); the reports carry the cost per
1,000 requests and `compare` shows its change."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import UpProcess, report_figures
from tiermesh.bench import replay

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RATE_RPS = 30
DURATION_S = 8


def tm(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def export_when(redis_url: str, out: Path, expected: int) -> list[dict[str, Any]]:
    """Exports once the gateways' writer has flushed `expected` records (deadline 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        tm("capture", "--redis-url", redis_url, "export", "--out", str(out))
        records = replay.load(out)
        if len(records) >= expected or time.monotonic() > deadline:
            return records
        time.sleep(0.1)  # polling the capture stream under a deadline


def close(a: float, b: float, rel: float, floor: float = 0.0) -> bool:
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)


def test_capture_replays_to_the_same_mix_and_figures(
    new_up: Callable[..., UpProcess],
    tmp_path: Path,
    record_property: Callable[[str, Any], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    up = new_up(span_files=False)
    redis_url = up.redis_url()
    mesh = "center=" + ",".join(up.metrics_urls().values())
    cost_args = ("--mesh-metrics", mesh)

    # A cold mesh (first sessions, first tokenizations) would make the baseline slower
    # than any replay: warm it first, uncaptured.
    tm("steady", "--url", up.url, "--model", "echo", "--requests", "100", "--concurrency", "4",
       "--priorities", "1=0.3,2=0.7", "--no-progress", "--out", str(tmp_path / "warm"))  # fmt: skip
    tm("capture", "--redis-url", redis_url, "start", "--rate", "1")
    base = tmp_path / "base"
    tm(
        "burst", "--url", up.url, "--model", "echo",
        "--rate", str(RATE_RPS), "--spike-every-s", "0", "--duration-s", str(DURATION_S),
        "--requests", "1000", "--priorities", "1=0.3,2=0.7", "--warmup", "0",
        "--no-progress", "--out", str(base), *cost_args,
    )  # fmt: skip
    tm("capture", "--redis-url", redis_url, "stop")
    doc_a = json.loads((base / "report.json").read_text())
    sent = doc_a["overall"]["sent"]
    captured = export_when(redis_url, tmp_path / "a.jsonl", sent)
    assert len(captured) == sent
    assert all("TEXT" not in json.dumps(r.get("contents", "")) for r in captured)

    replays = []
    for n in (1, 2):
        tm("capture", "--redis-url", redis_url, "clear")
        tm("capture", "--redis-url", redis_url, "start", "--rate", "1")
        out = tmp_path / f"replay{n}"
        tm("replay", str(tmp_path / "a.jsonl"), "--url", up.url, "--out", str(out), *cost_args)
        tm("capture", "--redis-url", redis_url, "stop")
        doc = json.loads((out / "report.json").read_text())
        again = export_when(redis_url, tmp_path / f"b{n}.jsonl", doc["overall"]["sent"])
        replays.append((doc, again))

    (doc_r1, captured_r1), (doc_r2, _) = replays
    # The same mix: histograms of the gateway's own records within 2 points per bin.
    for key in ("size", "priority"):
        ha, hb = replay.histogram(captured, key), replay.histogram(captured_r1, key)
        assert set(ha) == set(hb), key
        assert all(abs(ha[k] - hb[k]) <= 0.02 for k in ha), (key, ha, hb)
    assert {r["priority"]: r["sent"] for r in doc_r1["by_priority"]} == {
        r["priority"]: r["sent"] for r in replay_priorities(captured)
    }

    o_a, o_1, o_2 = doc_a["overall"], doc_r1["overall"], doc_r2["overall"]
    figures = {
        "requests": sent,
        "throughput_rps": [round(o["throughput_rps"], 1) for o in (o_a, o_1, o_2)],
        "p50_ms": [round(o["p50_ms"], 2) for o in (o_a, o_1, o_2)],
        "p99_ms": [round(o["p99_ms"], 2) for o in (o_a, o_1, o_2)],
        "cost_per_1k": [d["cost"]["per_1k_requests"] for d in (doc_a, doc_r1, doc_r2)],
    }
    with capsys.disabled():
        print(
            "\n" + report_figures("capture-replay", figures, tmp_path / "f.json", record_property)
        )
    assert o_a["error_rate"] == 0 and o_1["error_rate"] == 0
    # Open loop on the same arrival times: throughput is the arrival rate, within 5%.
    assert close(o_a["throughput_rps"], o_1["throughput_rps"], 0.05)
    # Latency: the noise between the two replays of one capture, with a floor for this
    # shared 2-core machine (p50 within 1.5 ms or 40%, p99 within 15 ms or 100%).
    noise_p50 = abs(o_1["p50_ms"] - o_2["p50_ms"]) / max(o_1["p50_ms"], o_2["p50_ms"])
    noise_p99 = abs(o_1["p99_ms"] - o_2["p99_ms"]) / max(o_1["p99_ms"], o_2["p99_ms"])
    assert close(o_a["p50_ms"], o_1["p50_ms"], max(0.4, 2 * noise_p50), floor=1.5)
    assert close(o_a["p99_ms"], o_1["p99_ms"], max(1.0, 2 * noise_p99), floor=15)

    for doc in (doc_a, doc_r1):
        assert doc["cost"]["per_1k_requests"] > 0
        assert doc["cost"]["tiers"][0]["cpu_s"] > 0
    assert "Cost per 1,000 requests" in (base / "summary.md").read_text()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiermesh.cli.main",
            "bench",
            "compare",
            str(base),
            str(tmp_path / "replay1"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "per_1k_requests" in done.stdout and "%" in done.stdout, done.stdout


def replay_priorities(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    counts: dict[int, int] = {}
    for r in records:
        counts[r["priority"]] = counts.get(r["priority"], 0) + 1
    return [{"priority": k, "sent": v} for k, v in counts.items()]
