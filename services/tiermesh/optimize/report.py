"""The optimize report: report.json with every figure, report.md with the table, and
accuracy_vs_throughput.png."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tiermesh.optimize.evaluate import Accuracy, Speed


@dataclass
class VariantResult:
    name: str
    file: str
    size_mb: float
    accuracy: Accuracy
    speed: Speed
    peak_rss_mb: float
    cold_start_s: float
    passed: bool
    excluded_nodes: list[str] = field(default_factory=list)
    note: str = ""


def markdown(
    model: str, gate: str, results: list[VariantResult], skipped: dict[str, str] | None = None
) -> str:
    base = next((r for r in results if r.name == "fp32"), None)
    lengths = sorted({n for r in results for n in r.speed.batch1_ms})
    head = ["variant", "gate", "cos mean", "cos p1", "cos min", "MB", "RSS MB", "cold s"]
    head += [f"p50/p95 ms @{n}" for n in lengths] + ["best batch", "seq/s", "x fp32"]
    lines = [
        f"# tiermesh optimize: {model} (gate {gate})",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in results:
        ratio = r.speed.best_seq_per_s / base.speed.best_seq_per_s if base else float("nan")
        cells = [
            r.name,
            "pass" if r.passed else "FAIL",
            f"{r.accuracy.mean:.5f}",
            f"{r.accuracy.p1:.5f}",
            f"{r.accuracy.min:.5f}",
            f"{r.size_mb:.1f}",
            f"{r.peak_rss_mb:.0f}",
            f"{r.cold_start_s:.2f}",
            *(
                "{:.2f}/{:.2f}".format(*r.speed.batch1_ms[n]) if n in r.speed.batch1_ms else "-"
                for n in lengths
            ),
            str(r.speed.best_batch),
            f"{r.speed.best_seq_per_s:.0f}",
            f"{ratio:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in results:
        if base and r.name != "fp32" and r.speed.best_seq_per_s < base.speed.best_seq_per_s:
            lines.append(
                f"- **{r.name} is slower than fp32 on this CPU** "
                f"({r.speed.best_seq_per_s:.0f} vs {base.speed.best_seq_per_s:.0f} seq/s)."
            )
        if r.excluded_nodes:
            lines.append(
                f"- {r.name} keeps {len(r.excluded_nodes)} node(s) in FP32: "
                + ", ".join(r.excluded_nodes)
            )
        if r.note:
            lines.append(f"- {r.name}: {r.note}")
    for name, why in (skipped or {}).items():
        lines.append(f"- **{name}: {why}**")
    return "\n".join(lines) + "\n"


def plot(path: Path, model: str, results: list[VariantResult]) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for r in results:
        ax.scatter(r.speed.best_seq_per_s, r.accuracy.mean, marker="o" if r.passed else "x")
        ax.annotate(
            r.name,
            (r.speed.best_seq_per_s, r.accuracy.mean),
            textcoords="offset points",
            xytext=(5, 5),
        )
    ax.set_xlabel("throughput at the best batch (sequences/s)")
    ax.set_ylabel("mean cosine vs fp32")
    ax.set_title(f"Accuracy vs throughput: {model} (o pass, x fail)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(
    out: Path,
    model: str,
    gate: str,
    results: list[VariantResult],
    skipped: dict[str, str] | None = None,
) -> None:
    """`skipped`: variants that were not built or were rejected, with the reason."""
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "model": model,
        "gate": gate,
        "variants": [asdict(r) for r in results],
        "skipped": skipped or {},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(markdown(model, gate, results, skipped))
    plot(out / "accuracy_vs_throughput.png", model, results)
