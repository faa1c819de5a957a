"""bench report: the JSON document, summary.md tables, plots, and `bench compare`."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bench_stats import rec
from tiermesh.bench import compare, markdown, plots, report
from tiermesh.bench.config import BenchConfig
from tiermesh.bench.ladder import LadderPlan, make_step
from tiermesh.bench.records import Record
from tiermesh.cli.main import main

STAGES = {"queue": 1.0, "preprocess": 0.5, "batch_wait": 2.0, "compute": 3.0}


def records() -> list[Record]:
    out = []
    for i in range(60):
        length, bucket = ("short", 16) if i % 4 else ("medium", 64)
        out.append(
            rec(
                8.0 + i % 7,
                start_s=i * 0.05,
                length=length,
                bucket=bucket,
                priority=1 + i % 2,
                stages={**STAGES, "postprocess": 0.2, "delivery": 0.3},
                batch_size=4,
            )
        )
    out.append(rec(50.0, "RESOURCE_EXHAUSTED", start_s=1.0, length="short", priority=2))
    return out


def run_result(scenario: str = "steady", **extra: Any) -> report.RunResult:
    cfg = BenchConfig(scenario=scenario, out_dir=Path("x"), priorities=((1, 0.5), (2, 0.5)))
    return report.RunResult(
        config=cfg.as_dict(),
        records=records(),
        wall_s=3.0,
        cpu={"cpu_s": 0.3, "user_s": 0.25, "system_s": 0.05, "wall_s": 3.0, "requests": 61}
        | {"cpu_s_per_request": 0.3 / 61, "cores_used": 0.1},
        started_at="2030-01-01T00:00:00+0000",
        text_model=True,
        **extra,
    )


def document(scenario: str = "steady", **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = report.clean(report.build(run_result(scenario, **extra)))
    return doc


def test_report_has_every_figure() -> None:
    doc = document()
    for key in (
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
        "config",
    ):
        assert key in doc, key
    assert doc["overall"]["sent"] == 61 and doc["overall"]["errors"] == 1
    assert doc["errors_by_code"] == {"RESOURCE_EXHAUSTED": 1}
    assert [r["length"] for r in doc["by_length"]] == ["short", "medium"]
    # The refused short text counts against the bucket its class usually lands in.
    row = next(r for r in doc["by_bucket_priority"] if (r["bucket"], r["priority"]) == ("16", 2))
    assert row["errors"] == 1
    assert doc["breakdown_ms"]["16"]["compute"] == pytest.approx(3.0)
    assert doc["queue_depth"]["source"] == "client_in_flight"
    assert "no metrics" in doc["queue_depth"]["note"]
    assert doc["cpu"]["client_busy"] is False
    assert doc["ladder"] is None and doc["concurrency"] == 8
    json.dumps(doc, allow_nan=False)  # NaN became null


def test_metrics_samples_replace_the_in_flight_count() -> None:
    doc = document(metrics_url="http://127.0.0.1:1/metrics", metrics_samples=[(0.0, 3.0)])
    assert doc["queue_depth"]["source"] == "metrics"
    assert doc["queue_depth"]["samples"] == [[0.0, 3.0]]


def ladder_doc() -> dict[str, Any]:
    recs = records()
    steps = [
        make_step(0, 1, recs[:20], 1.0),
        make_step(1, 2, recs[20:40], 0.5),
        make_step(2, 4, recs[40:], 0.5),
    ]
    return document("ladder", ladder_plan=LadderPlan(), ladder_steps=steps, ladder_stop="test stop")


def test_ladder_report_carries_steps_and_knee() -> None:
    doc = ladder_doc()
    assert [s["concurrency"] for s in doc["ladder"]["steps"]] == [1, 2, 4]
    assert doc["ladder"]["knee"]["concurrency"] == 2
    md = markdown.render(doc)
    assert "## Ladder" in md and "Knee: concurrency 2" in md and "test stop" in md


def test_summary_markdown_has_the_tables() -> None:
    md = markdown.render(document())
    assert "## Overall" in md
    assert "| bucket | priority | sent | ok | error rate | throughput /s |" in md
    assert "| 16 | 2 |" in md and "| 64 | 1 |" in md
    assert "## Per length class" in md and "| short |" in md
    assert "## Time breakdown per bucket" in md and "| queue | preprocess | batch_wait |" in md
    assert "## Load generator CPU" in md and "cpu s / request" in md
    assert "| RESOURCE_EXHAUSTED | 1 |" in md
    for line in md.splitlines():
        if line.startswith("|"):
            assert line.endswith("|")


def test_busy_client_is_called_out() -> None:
    run = run_result()
    run.cpu["cores_used"] = 0.95
    md = markdown.render(report.clean(report.build(run)))
    assert "load generator kept most of a core busy" in md


def test_write_load_roundtrip_and_plots(tmp_path: Path) -> None:
    doc = ladder_doc()
    names = plots.render_all(doc, tmp_path)
    assert len(names) == 5
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report.write_json(doc, tmp_path)
    assert report.load(tmp_path) == doc
    with pytest.raises(ValueError):
        report.load(tmp_path / "nothing")


def test_plots_of_a_report_without_timings(tmp_path: Path) -> None:
    doc = document("burst")
    doc["breakdown_ms"] = {}
    doc["queue_depth"]["samples"] = []
    assert len(plots.render_all(doc, tmp_path)) == 5


def worse(doc: dict[str, Any], throughput: float = 1.0, p99: float = 1.0) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    for row in [out["overall"], *out["by_bucket_priority"]]:
        row["throughput_rps"] *= throughput
        row["p99_ms"] *= p99
    return out


def test_compare_identical_reports_flags_nothing() -> None:
    doc = document()
    deltas = compare.compare(doc, doc)
    assert not [d for d in deltas if d.regression]
    assert "no regressions" in compare.render("a", "b", deltas, [])


def test_compare_flags_throughput_and_p99_past_ten_percent() -> None:
    doc = document()
    assert not [d for d in compare.compare(doc, worse(doc, 0.95, 1.05)) if d.regression]
    flagged = [d for d in compare.compare(doc, worse(doc, throughput=0.85)) if d.regression]
    assert {(d.scope, d.metric) for d in flagged} >= {("overall", "throughput_rps")}
    assert all(d.metric == "throughput_rps" for d in flagged)
    flagged = [d for d in compare.compare(doc, worse(doc, p99=1.2)) if d.regression]
    assert {d.metric for d in flagged} == {"p99_ms"}
    text = compare.render("a", "b", flagged, [])
    assert "REGRESSION" not in text or "regression(s)" in text


def test_compare_flags_error_rate_and_ignores_small_groups() -> None:
    doc = document()
    bad = copy.deepcopy(doc)
    bad["overall"]["error_rate"] = doc["overall"]["error_rate"] + 0.05
    small = min(r["ok"] for r in doc["by_bucket_priority"])
    assert small < compare.Thresholds().min_ok
    for row in bad["by_bucket_priority"]:
        row["p99_ms"] *= 3
    flagged = {(d.scope, d.metric) for d in compare.compare(doc, bad) if d.regression}
    assert ("overall", "error_rate") in flagged
    assert ("bucket 16 / priority 2", "p99_ms") in flagged  # 30 answers
    assert ("bucket 64 / priority 1", "p99_ms") not in flagged  # 15 answers


def test_compare_faster_is_not_a_regression() -> None:
    doc = document()
    assert not [d for d in compare.compare(doc, worse(doc, 1.5, 0.5)) if d.regression]


def test_compare_notes_different_settings() -> None:
    a, b = document(), document("burst")
    notes = compare.mismatches(a, b)
    assert any(n.startswith("scenario") for n in notes)
    assert math.isclose(
        compare.delta("x", "p99_ms", 10, 12, compare.Thresholds(), False).change or 0, 0.2
    )


def test_bench_compare_command_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = document()
    report.write_json(doc, tmp_path / "a")
    report.write_json(doc, tmp_path / "same")
    report.write_json(worse(doc, throughput=0.5), tmp_path / "slow")
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    assert "no regressions" in capsys.readouterr().out
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "slow")]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "throughput_rps" in out
    assert main(["bench", "compare", str(tmp_path / "a"), str(tmp_path / "missing")]) == 2
