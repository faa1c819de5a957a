"""`tiermesh bench` as a subprocess against a running mesh: report files, plots and sane
figures for a steady run, a text run with priorities, and a short ladder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import UpProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PLOTS = (
    "latency_vs_concurrency.png",
    "throughput_vs_concurrency.png",
    "throughput_over_time.png",
    "time_breakdown.png",
    "queue_depth.png",
)
KEYS = (
    "overall",
    "errors_by_code",
    "by_length",
    "by_bucket",
    "by_priority",
    "by_bucket_priority",
    "breakdown_ms",
    "timeline",
    "queue_depth",
    "cpu",
    "ladder",
    "config",
)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", "bench", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def check_report(out: Path) -> dict[str, Any]:
    for name in ("report.json", "summary.md", *PLOTS):
        assert (out / name).is_file(), name
    for name in PLOTS:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    doc: dict[str, Any] = json.loads((out / "report.json").read_text())
    for key in KEYS:
        assert key in doc, key
    o = doc["overall"]
    assert o["throughput_rps"] > 0
    assert o["error_rate"] == 0 and doc["errors_by_code"] == {}
    assert 0 < o["p50_ms"] <= o["p95_ms"] <= o["p99_ms"] < 10_000
    assert doc["cpu"]["cpu_s"] > 0 and doc["cpu"]["cpu_s_per_request"] > 0
    assert doc["cpu"]["cores_used"] > 0
    assert doc["queue_depth"]["source"] == "client_in_flight"
    summary = (out / "summary.md").read_text()
    assert "| bucket | priority |" in summary and "## Load generator CPU" in summary
    return doc


def test_steady_writes_a_full_report(mesh_up: UpProcess, tmp_path: Path) -> None:
    out = tmp_path / "steady"
    done = bench(
        "steady",
        "--url", mesh_up.url,
        "--model", "mlp",
        "--requests", "100",
        "--concurrency", "8",
        "--duration-s", "30",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "report:" in done.stdout
    doc = check_report(out)
    assert doc["overall"]["sent"] == 100 and doc["overall"]["ok"] == 100
    assert doc["concurrency"] == 8
    # The mesh reports its stages: the breakdown holds server time, not only latency.
    (row,) = doc["breakdown_ms"].values()
    assert row["compute"] > 0 and row["n"] == 100
    assert "\x1b[" not in done.stderr  # no progress bar without a terminal

    again = bench("compare", str(out), str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "no regressions" in again.stdout


def test_text_model_with_priorities(mesh_up: UpProcess, tmp_path: Path) -> None:
    out = tmp_path / "text"
    done = bench(
        "steady",
        "--url", mesh_up.url,
        "--model", "echo",
        "--requests", "100",
        "--concurrency", "4",
        "--priorities", "1=0.3,2=0.7",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = check_report(out)
    assert {r["length"]: r["sent"] for r in doc["by_length"]} == {
        "short": 70,
        "medium": 25,
        "long": 5,
    }
    assert {r["priority"]: r["sent"] for r in doc["by_priority"]} == {1: 30, 2: 70}


def test_short_ladder_reports_steps_and_a_knee(mesh_up: UpProcess, tmp_path: Path) -> None:
    out = tmp_path / "ladder"
    done = bench(
        "ladder",
        "--url", mesh_up.url,
        "--model", "mlp",
        "--steps", "1,2,4",
        "--step-requests", "60",
        "--step-duration-s", "10",
        "--slo-ms", "5000",
        "--out", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = check_report(out)
    steps = doc["ladder"]["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4][: len(steps)]
    assert len(steps) >= 2 and all(s["sent"] == 60 for s in steps)
    assert all(s["throughput_rps"] > 0 for s in steps)
    assert doc["ladder"]["stop_reason"]
    assert doc["ladder"]["knee"]["concurrency"] in (1, 2, 4)
