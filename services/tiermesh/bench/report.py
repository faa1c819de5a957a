"""A run's report: every figure in one JSON document, read back by `compare` and plots.

The document is plain JSON (NaN written as null). Groupings are lists of rows, each with
its key fields (`length`, `bucket`, `priority`) followed by the figures of `stats.figures`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiermesh.bench import genstats, stats
from tiermesh.bench.ladder import LadderPlan, Step, knee
from tiermesh.bench.records import Record
from tiermesh.bench.workload import DEFAULT_LENGTHS, NUMERIC

SCHEMA = 1
REPORT_JSON = "report.json"
SUMMARY_MD = "summary.md"
# Above this many cores the client itself may be what limits the figures.
CLIENT_BUSY_CORES = 0.8
# Resolution of the client in-flight series, as a fraction of the run.
IN_FLIGHT_POINTS = 200
LENGTH_ORDER = [*DEFAULT_LENGTHS, NUMERIC]


@dataclass
class RunResult:
    """What a session measured, before any summary."""

    config: dict[str, Any]
    records: list[Record]
    wall_s: float
    cpu: dict[str, Any]
    started_at: str
    text_model: bool
    inputs: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    ladder_plan: LadderPlan | None = None
    ladder_steps: list[Step] = field(default_factory=list)
    ladder_stop: str = ""
    metrics_url: str = ""
    metrics_samples: list[tuple[float, float]] = field(default_factory=list)
    metrics_error: str = ""
    # The cost section (bench/cost.py): per tier, in all, per 1,000 requests, per M tokens.
    cost: dict[str, Any] = field(default_factory=dict)


def _in_flight_series(records: Sequence[Record], wall_s: float) -> list[list[float]]:
    step = max(wall_s / IN_FLIGHT_POINTS, 0.01)
    count = max(1, math.ceil(wall_s / step)) if wall_s > 0 else 1
    peaks = stats.in_flight_peaks(records, step, count)
    return [[i * step, float(p)] for i, p in enumerate(peaks)]


def queue_depth(run: RunResult) -> dict[str, Any]:
    """The mesh's queue depth over time when metrics came back; the client's own
    requests in flight always (the only series without metrics)."""
    in_flight = _in_flight_series(run.records, run.wall_s)
    if run.metrics_samples:
        return {
            "source": "metrics",
            "url": run.metrics_url,
            "note": f"tiermesh_queue_depth of {run.config['model']} from {run.metrics_url}",
            "samples": [list(s) for s in run.metrics_samples],
            "client_in_flight": in_flight,
        }
    why = (
        f"no metrics ({run.metrics_error})" if run.metrics_url else "no metrics (no --metrics-url)"
    )
    return {
        "source": "client_in_flight",
        "url": run.metrics_url,
        "note": f"{why}: the client's requests in flight instead",
        "samples": in_flight,
        "client_in_flight": in_flight,
    }


def closed_loop(config: dict[str, Any]) -> bool:
    """The run's callers kept a fixed concurrency (steady, soak; generate without a rate)."""
    if config["scenario"] == "generate":
        return not config["generation"]["rate_rps"]
    return config["scenario"] in ("steady", "soak")


def build(run: RunResult) -> dict[str, Any]:
    """The report document of one run (plots are added by whoever renders them)."""
    records = run.records
    buckets = stats.bucket_labels(records)
    lengths = [r.length for r in records]
    priorities = [r.priority for r in records]
    overall = stats.figures(records, run.wall_s)
    windows = stats.timeline(records, float(run.config["window_s"]), run.wall_s)
    sent_latency = math.fsum(r.outcome.latency_ms for r in records if r.sent) / 1000.0
    scenario = run.config["scenario"]
    cpu = dict(run.cpu)
    cpu["client_busy"] = bool(cpu.get("cores_used", 0.0) > CLIENT_BUSY_CORES)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool": "tiermesh bench",
        "scenario": scenario,
        "model": run.config["model"],
        "url": run.config["url"],
        "started_at": run.started_at,
        "wall_s": run.wall_s,
        "interrupted": run.interrupted,
        "config": run.config,
        "workload": {"text_model": run.text_model, "inputs": run.inputs},
        "concurrency": run.config["concurrency"] if closed_loop(run.config) else None,
        # Little's law over the run: the mean number of requests outstanding.
        "mean_in_flight": sent_latency / run.wall_s if run.wall_s > 0 else math.nan,
        "overall": overall.as_dict(),
        "errors_by_code": overall.errors_by_code,
        "by_length": sorted(
            stats.grouped(records, run.wall_s, {"length": lengths}),
            key=lambda row: (
                LENGTH_ORDER.index(row["length"])
                if row["length"] in LENGTH_ORDER
                else len(LENGTH_ORDER)
            ),
        ),
        "by_bucket": stats.grouped(records, run.wall_s, {"bucket": buckets}),
        "by_priority": stats.grouped(records, run.wall_s, {"priority": priorities}),
        "by_bucket_priority": stats.grouped(
            records, run.wall_s, {"bucket": buckets, "priority": priorities}
        ),
        "breakdown_ms": stats.breakdown(records, buckets),
        "server": stats.server_figures(records),
        "retry_after": stats.retry_after(records),
        "timeline": {
            "window_s": run.config["window_s"],
            "windows": windows,
            "drift": stats.drift(windows),
        },
        "open_loop": {"send_lag": stats.lag_figures(records)}
        if scenario in ("burst", "replay")
        or (scenario == "generate" and not closed_loop(run.config))
        else None,
        "generation": genstats.section(
            records, run.wall_s, bool(run.config["generation"]["stream"])
        )
        if scenario == "generate"
        else None,
        "ladder": None,
        "queue_depth": queue_depth(run),
        "cpu": cpu,
        "cost": run.cost or None,
        "plots": [],
    }
    if scenario == "single":
        doc["concurrency"] = 1
    if run.ladder_plan is not None:
        found = knee(run.ladder_steps, run.ladder_plan)
        doc["ladder"] = {
            "steps": [s.as_dict() for s in run.ladder_steps],
            "stop_reason": run.ladder_stop,
            "knee": found.as_dict() if found is not None else None,
        }
    return doc


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become null, tuples lists, keys strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def write_json(doc: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / REPORT_JSON
    path.write_text(json.dumps(clean(doc), indent=2, allow_nan=False) + "\n")
    return path


def load(path: Path) -> dict[str, Any]:
    """A report from its directory or its report.json; ValueError when it is not one."""
    file = path / REPORT_JSON if path.is_dir() else path
    try:
        doc = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: not a readable report ({exc})") from None
    if not isinstance(doc, dict) or doc.get("tool") != "tiermesh bench":
        raise ValueError(f"{file}: not a tiermesh bench report")
    return doc
