"""The optimize gate and report, on figures made up in the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiermesh.optimize.evaluate import Accuracy, Speed
from tiermesh.optimize.gate import parse_gate
from tiermesh.optimize.report import VariantResult, markdown, write


@pytest.mark.parametrize(
    ("text", "metric", "threshold"),
    [
        ("cosine>=0.99", "cosine", 0.99),
        (" cosine_min >= 0.95 ", "cosine_min", 0.95),
        ("cosine_p1>=1", "cosine_p1", 1.0),
    ],
)
def test_gates_parse(text: str, metric: str, threshold: float) -> None:
    gate = parse_gate(text)
    assert (gate.metric, gate.threshold) == (metric, threshold)


@pytest.mark.parametrize("text", ["cosine>0.99", "top1>=0.9", "cosine>=1.5", "cosine>=0"])
def test_bad_gates_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="gate"):
        parse_gate(text)


def test_gate_reads_the_right_figure() -> None:
    acc = Accuracy(mean=0.995, p1=0.97, min=0.90)
    assert parse_gate("cosine>=0.99").passes(acc)
    assert not parse_gate("cosine_p1>=0.98").passes(acc)
    assert not parse_gate("cosine_min>=0.95").passes(acc)


def _result(name: str, seq_s: float, mean: float, passed: bool, **kw: object) -> VariantResult:
    return VariantResult(
        name=name,
        file=f"model.{name}.onnx",
        size_mb=10.0,
        accuracy=Accuracy(mean, mean - 0.01, mean - 0.02),
        speed=Speed({16: (1.0, 2.0)}, 8, seq_s),
        peak_rss_mb=100.0,
        cold_start_s=0.1,
        passed=passed,
        **kw,  # type: ignore[arg-type]
    )


def test_the_report_says_plainly_what_is_slower_and_what_was_excluded(tmp_path: Path) -> None:
    results = [
        _result("fp32", 100.0, 1.0, True),
        _result("fp16", 60.0, 0.9999, True),
        _result("int8mixed", 180.0, 0.991, True, excluded_nodes=["MatMul_3", "MatMul_7"]),
        _result("int4", 150.0, 0.93, False),
    ]
    md = markdown("minilm-l6", "cosine>=0.99", results)
    assert "**fp16 is slower than fp32 on this CPU** (60 vs 100 seq/s)" in md
    assert "int8mixed keeps 2 node(s) in FP32: MatMul_3, MatMul_7" in md
    assert "| int4 | FAIL |" in md
    write(tmp_path, "minilm-l6", "cosine>=0.99", results)
    data = json.loads((tmp_path / "report.json").read_text())
    assert [v["name"] for v in data["variants"]] == ["fp32", "fp16", "int8mixed", "int4"]
    assert (tmp_path / "accuracy_vs_throughput.png").stat().st_size > 1000
