"""`tiermesh bench compare A B`: what changed from report A to report B, and whether it
is a regression.

Flagged: throughput lower by more than `throughput` (relative), p99 higher by more than
`p99` (relative), error rate higher by more than `error_rate` (absolute, a fraction of
requests sent), cost per 1,000 requests or per million tokens higher by more than `cost`
(relative; runs measured with --mesh-metrics). p50 and p95 are shown, never flagged. A
group answered fewer than `min_ok` times in either report is shown but not flagged: its
percentiles are noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

METRICS = ("throughput_rps", "p50_ms", "p95_ms", "p99_ms", "error_rate")
HIGHER_IS_BETTER = {"throughput_rps"}
COST_METRICS = ("per_1k_requests", "per_million_tokens")


@dataclass(frozen=True)
class Thresholds:
    throughput: float = 0.10
    p99: float = 0.10
    error_rate: float = 0.01
    min_ok: int = 20
    cost: float = 0.10


@dataclass(frozen=True)
class Delta:
    scope: str
    metric: str
    a: float | None
    b: float | None
    change: float | None  # relative for rates and latencies, absolute for error_rate
    regression: bool
    noisy: bool = False


def _num(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def delta(scope: str, metric: str, a: Any, b: Any, th: Thresholds, noisy: bool) -> Delta:
    """One metric's change and whether it crosses its threshold."""
    va, vb = _num(a), _num(b)
    if va is None or vb is None:
        return Delta(scope, metric, va, vb, None, False, noisy)
    if metric == "error_rate":
        change: float | None = vb - va
        worse = change is not None and change > th.error_rate
    else:
        change = (vb - va) / va if va else None
        if metric == "throughput_rps":
            worse = vb < va * (1 - th.throughput)
        elif metric == "p99_ms":
            worse = vb > va * (1 + th.p99)
        elif metric in COST_METRICS:
            worse = vb > va * (1 + th.cost)
        else:
            worse = False
    return Delta(scope, metric, va, vb, change, worse and not noisy, noisy)


def _rows(doc: dict[str, Any], grouping: str, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for row in doc.get(grouping) or []:
        label = " / ".join(f"{k} {row.get(k)}" for k in keys)
        out[label] = row
    return out


def compare(a: dict[str, Any], b: dict[str, Any], th: Thresholds | None = None) -> list[Delta]:
    """Deltas overall, per bucket x priority and (ladders) at the knee."""
    th = th or Thresholds()
    out = [
        delta("overall", m, a["overall"].get(m), b["overall"].get(m), th, False) for m in METRICS
    ]
    rows_a = _rows(a, "by_bucket_priority", ("bucket", "priority"))
    rows_b = _rows(b, "by_bucket_priority", ("bucket", "priority"))
    for scope in [s for s in rows_a if s in rows_b]:
        ra, rb = rows_a[scope], rows_b[scope]
        noisy = min(int(ra.get("ok") or 0), int(rb.get("ok") or 0)) < th.min_ok
        out += [delta(scope, m, ra.get(m), rb.get(m), th, noisy) for m in METRICS]
    knee_a = (a.get("ladder") or {}).get("knee")
    knee_b = (b.get("ladder") or {}).get("knee")
    if knee_a and knee_b:
        out.append(
            delta(
                "ladder knee",
                "throughput_rps",
                knee_a["throughput_rps"],
                knee_b["throughput_rps"],
                th,
                False,
            )
        )
        out.append(
            delta(
                "ladder knee",
                "concurrency",
                knee_a["concurrency"],
                knee_b["concurrency"],
                th,
                False,
            )
        )
    cpu_a, cpu_b = a.get("cpu") or {}, b.get("cpu") or {}
    out.append(
        delta(
            "client",
            "cpu_s_per_request",
            cpu_a.get("cpu_s_per_request"),
            cpu_b.get("cpu_s_per_request"),
            th,
            False,
        )
    )
    cost_a, cost_b = a.get("cost") or {}, b.get("cost") or {}
    currency = cost_b.get("currency") or cost_a.get("currency") or ""
    for metric in COST_METRICS:
        if cost_a.get(metric) is not None or cost_b.get(metric) is not None:
            scope = f"cost ({currency})" if currency else "cost"
            out.append(delta(scope, metric, cost_a.get(metric), cost_b.get(metric), th, False))
    return out


def mismatches(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Settings that differ between the runs: the comparison may not be like for like."""
    notes = []
    for key in ("scenario", "model"):
        if a.get(key) != b.get(key):
            notes.append(f"{key}: {a.get(key)} vs {b.get(key)}")
    ca, cb = a.get("config") or {}, b.get("config") or {}
    for key in ("seed", "mix", "priorities", "concurrency", "requests", "duration_s", "timeout_s"):
        if ca.get(key) != cb.get(key):
            notes.append(f"{key}: {ca.get(key)} vs {cb.get(key)}")
    only_a = set(_rows(a, "by_bucket_priority", ("bucket", "priority")))
    only_b = set(_rows(b, "by_bucket_priority", ("bucket", "priority")))
    for scope in sorted(only_a - only_b):
        notes.append(f"{scope}: only in A")
    for scope in sorted(only_b - only_a):
        notes.append(f"{scope}: only in B")
    return notes


def _value(metric: str, v: float | None) -> str:
    if v is None:
        return "-"
    if metric == "error_rate":
        return f"{v:.2%}"
    if metric == "cpu_s_per_request":
        return f"{v * 1e3:.3f} ms"
    if metric == "concurrency":
        return f"{v:g}"
    if metric in COST_METRICS:
        return f"{v:.6g}"
    return f"{v:,.2f}"


def _change(d: Delta) -> str:
    if d.change is None:
        return "-"
    if d.metric == "error_rate":
        return f"{d.change * 100:+.2f} pt"
    return f"{d.change:+.1%}"


def render(a_name: str, b_name: str, deltas: Sequence[Delta], notes: Sequence[str]) -> str:
    """A plain-text table of the deltas, regressions marked, and a verdict line."""
    header = ("scope", "metric", "A", "B", "change", "")
    rows = [
        (
            d.scope,
            d.metric,
            _value(d.metric, d.a),
            _value(d.metric, d.b),
            _change(d),
            "REGRESSION" if d.regression else ("(few answers)" if d.noisy else ""),
        )
        for d in deltas
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = [f"A: {a_name}", f"B: {b_name}"]
    lines += [f"note: {n}" for n in notes]
    lines.append("")
    for r in (header, *rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    flagged = [d for d in deltas if d.regression]
    lines.append("")
    if flagged:
        lines.append(
            f"{len(flagged)} regression(s): "
            + "; ".join(f"{d.scope} {d.metric} {_change(d)}" for d in flagged)
        )
    else:
        lines.append("no regressions")
    return "\n".join(lines) + "\n"
