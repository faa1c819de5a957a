"""PNG plots of a report document, drawn with matplotlib's Agg canvas (no display, no
pyplot state): they can be redrawn from any report.json."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tiermesh.bench.records import STAGES
from tiermesh.bench.stats import OUTSIDE

LATENCY = "latency_vs_concurrency.png"
THROUGHPUT = "throughput_vs_concurrency.png"
TIMELINE = "throughput_over_time.png"
BREAKDOWN = "time_breakdown.png"
QUEUE_DEPTH = "queue_depth.png"
TTFT = "ttft_distribution.png"
TPOT = "tpot_distribution.png"
DPI = 110


def _figure() -> tuple[Figure, Axes]:
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots()


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _num(values: Sequence[Any]) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def _title(doc: dict[str, Any], what: str) -> str:
    return f"{what}: {doc['model']}, {doc['scenario']}"


def _points(doc: dict[str, Any]) -> tuple[list[float], str, list[dict[str, Any]]]:
    """x values, x label and rows with throughput / percentiles: the ladder's steps, or
    the whole run as one point (closed loop: its callers; open loop: mean in flight)."""
    ladder = doc.get("ladder")
    if ladder and ladder["steps"]:
        steps = ladder["steps"]
        return _num([s["concurrency"] for s in steps]), "concurrency (closed-loop callers)", steps
    o = doc["overall"]
    if doc.get("concurrency") is not None:
        return [float(doc["concurrency"])], "concurrency (closed-loop callers)", [o]
    return _num([doc.get("mean_in_flight")]), "mean requests in flight (open loop)", [o]


def _log2_if_ladder(ax: Axes, doc: dict[str, Any]) -> None:
    if doc.get("ladder") and len(doc["ladder"]["steps"]) > 1:
        ax.set_xscale("log", base=2)


def latency_vs_concurrency(doc: dict[str, Any], ax: Axes) -> None:
    xs, label, rows = _points(doc)
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        ax.plot(xs, _num([r[f"{q}_ms"] for r in rows]), style, label=q)
    slo = (doc["config"].get("ladder") or {}).get("slo_ms")
    if doc.get("ladder") and slo:
        ax.axhline(slo, color="red", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
    _knee(ax, doc)
    _log2_if_ladder(ax, doc)
    ax.set_xlabel(label)
    ax.set_ylabel("latency (ms)")
    ax.set_title(_title(doc, "Latency percentiles"))
    ax.legend()
    ax.grid(alpha=0.3)


def throughput_vs_concurrency(doc: dict[str, Any], ax: Axes) -> None:
    xs, label, rows = _points(doc)
    ax.plot(xs, _num([r["throughput_rps"] for r in rows]), "o-", label="answered / s")
    _knee(ax, doc)
    _log2_if_ladder(ax, doc)
    ax.set_xlabel(label)
    ax.set_ylabel("throughput (requests / s)")
    ax.set_ylim(bottom=0)
    ax.set_title(_title(doc, "Throughput"))
    ax.legend()
    ax.grid(alpha=0.3)


def _knee(ax: Axes, doc: dict[str, Any]) -> None:
    knee = (doc.get("ladder") or {}).get("knee")
    if knee:
        ax.axvline(knee["concurrency"], color="green", linestyle=":", label="knee")


def throughput_over_time(doc: dict[str, Any], ax: Axes) -> None:
    windows = doc["timeline"]["windows"]
    mids = _num([w["t_s"] + w["len_s"] / 2 for w in windows])
    ax.plot(mids, _num([w["sent_rps"] for w in windows]), ":", color="0.5", label="sent / s")
    ax.plot(mids, _num([w["throughput_rps"] for w in windows]), "-", label="answered / s")
    ax.plot(mids, _num([w["errors_rps"] for w in windows]), "-", label="failed / s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("requests / s")
    ax.set_ylim(bottom=0)
    right = ax.twinx()
    right.plot(mids, _num([w["p99_ms"] for w in windows]), "--", color="tab:red", label="p99 ms")
    right.set_ylabel("p99 latency (ms)")
    right.set_ylim(bottom=0)
    lines, labels = ax.get_legend_handles_labels()
    more, more_labels = right.get_legend_handles_labels()
    ax.legend(lines + more, labels + more_labels, loc="upper left", fontsize="small")
    ax.set_title(_title(doc, f"Over time ({doc['timeline']['window_s']:g} s windows)"))
    ax.grid(alpha=0.3)


def time_breakdown(doc: dict[str, Any], ax: Axes) -> None:
    data: dict[str, dict[str, float | None]] = doc["breakdown_ms"]
    buckets = list(data)
    if not buckets or not any(any(s in data[b] for s in STAGES) for b in buckets):
        _note(ax, "no timing parameters in the responses")
        ax.set_title(_title(doc, "Time per stage"))
        return
    bottoms = [0.0] * len(buckets)
    for part in (*STAGES, OUTSIDE):
        heights = [max(float(data[b].get(part) or 0.0), 0.0) for b in buckets]
        ax.bar(buckets, heights, bottom=bottoms, label=part)
        bottoms = [lo + h for lo, h in zip(bottoms, heights, strict=True)]
    ax.set_xlabel("length bucket (as the mesh reports it)")
    ax.set_ylabel("mean time (ms)")
    ax.set_title(_title(doc, "Time per stage and bucket"))
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3, axis="y")


def queue_depth(doc: dict[str, Any], ax: Axes) -> None:
    q = doc["queue_depth"]
    samples = q["samples"]
    note: str | None = None
    if q["source"] == "metrics":
        label, title = "tiermesh_queue_depth (metrics)", "Queue depth"
        own = q.get("client_in_flight") or []
        if own:
            ts, values = _num([s[0] for s in own]), _num([s[1] for s in own])
            ax.step(ts, values, where="post", color="0.6", linestyle=":", label="client in flight")
    else:
        label, title = "client in flight", "No metrics: client requests in flight"
        note = textwrap.fill(q["note"], 60)
    if samples:
        ts, values = _num([s[0] for s in samples]), _num([s[1] for s in samples])
        ax.step(ts, values, where="post", label=label)
        ax.legend(title=note, title_fontsize="x-small", loc="upper right")
    else:
        _note(ax, "no samples" if note is None else f"no samples\n{note}")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("requests")
    ax.set_ylim(bottom=0)
    ax.set_title(_title(doc, title))
    ax.grid(alpha=0.3)


def _distribution(doc: dict[str, Any], ax: Axes, what: str, key: str) -> None:
    """The cumulative distribution of a generation figure, client (solid) and server
    (dashed), from the report's quantiles; the client's p50 / p90 / p99 marked."""
    g = doc.get("generation") or {}
    quantiles = g.get("quantiles") or {}
    drawn = False
    for source, style, label in ((key, "-", "client"), (f"server_{key}", "--", "server")):
        points = quantiles.get(source) or []
        if points:
            qs, values = _num([p[0] for p in points]), _num([p[1] for p in points])
            ax.plot(values, [q / 100 for q in qs], style, label=label)
            drawn = True
    if not drawn:
        _note(ax, f"no {what} values (no answered requests with them)")
    else:
        figures = g.get(key) or {}
        for q, color in (("p50", "tab:green"), ("p90", "tab:orange"), ("p99", "tab:red")):
            if figures.get(q) is not None:
                x = float(figures[q])
                ax.axvline(
                    x, color=color, linestyle=":", linewidth=1, label=f"client {q} {x:,.1f} ms"
                )
        ax.legend(fontsize="small", loc="lower right")
        ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{what} (ms)")
    ax.set_ylabel("share of answered requests")
    ax.set_title(_title(doc, f"{what} distribution"))
    ax.grid(alpha=0.3)


def ttft_distribution(doc: dict[str, Any], ax: Axes) -> None:
    _distribution(doc, ax, "time to first token", "ttft_ms")


def tpot_distribution(doc: dict[str, Any], ax: Axes) -> None:
    _distribution(doc, ax, "time per output token", "tpot_ms")


PLOTS: dict[str, Callable[[dict[str, Any], Axes], None]] = {
    LATENCY: latency_vs_concurrency,
    THROUGHPUT: throughput_vs_concurrency,
    TIMELINE: throughput_over_time,
    BREAKDOWN: time_breakdown,
    QUEUE_DEPTH: queue_depth,
}
# Drawn for reports with a generation section only.
GENERATION_PLOTS: dict[str, Callable[[dict[str, Any], Axes], None]] = {
    TTFT: ttft_distribution,
    TPOT: tpot_distribution,
}


def render_all(doc: dict[str, Any], out_dir: Path) -> list[str]:
    """Writes every plot of a (JSON-clean) report into `out_dir`; their file names."""
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = PLOTS | (GENERATION_PLOTS if doc.get("generation") else {})
    for name, draw in chosen.items():
        fig, ax = _figure()
        draw(doc, ax)
        fig.savefig(out_dir / name, dpi=DPI)
    return list(chosen)
