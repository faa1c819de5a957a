"""Gate records (core/gates.py) from measurements, and the INT8 variant a repository ships:
the first INT8 that passes the gate, the fastest kind tried first. Dynamic INT8 (weights
per channel, activations quantized at run time: onnxruntime's integer kernels, 2.2-2.6x
FP32's speed on MiniLM here) with the fewest most-sensitive MatMuls kept in FP32; else
static INT8 (QDQ) the same way, which may pass where dynamic cannot but ran only 1.13x
FP32's speed (benchmarks/RESULTS.md, issue 24).

Used by `tiermesh optimize` (a record beside each variant it writes) and `tiermesh models
fetch` (the MiniLM `int8` variant and its record).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from tiermesh.convert.minilm import quantize_int8
from tiermesh.core.gates import GateRecord
from tiermesh.core.repository import sha256_file
from tiermesh.core.text import TextEncoder
from tiermesh.optimize import calibrate, datasets, evaluate, sensitivity
from tiermesh.optimize.gate import AccuracyGate
from tiermesh.optimize.variants import VariantError

DEFAULT_GATE = AccuracyGate("cosine", 0.99)
DYNAMIC = "dynamic INT8, per channel"
STATIC = "static INT8 (QDQ)"


def gate_record(
    path: Path,
    acc: evaluate.Accuracy,
    gate: AccuracyGate,
    calibration: Sequence[str],
    evaluation: Sequence[str],
    excluded_nodes: Sequence[str] = (),
    method: str = "",
) -> GateRecord:
    """The record of the variant at `path`, measured as `acc` against the reference."""
    return GateRecord(
        file=path.name,
        sha256=sha256_file(path),
        gate=str(gate),
        value=round(gate.value(acc), 6),
        passed=gate.passes(acc),
        cosine={"mean": round(acc.mean, 6), "p1": round(acc.p1, 6), "min": round(acc.min, 6)},
        rows=len(evaluation),
        eval_sha256=datasets.texts_sha256(evaluation),
        calibration_sha256=datasets.texts_sha256(calibration),
        date=datetime.date.today().isoformat(),
        excluded_nodes=tuple(excluded_nodes),
        method=method,
    )


def gated_int8(
    fp32: Path,
    dst: Path,
    encoder: TextEncoder,
    gate: AccuracyGate = DEFAULT_GATE,
    calibration: Sequence[str] | None = None,
    evaluation: Sequence[str] | None = None,
) -> GateRecord:
    """INT8 of `fp32` at `dst` that passes `gate`, and its record: dynamic INT8; else
    dynamic, then static, with as few of the most sensitive MatMul/Gemm nodes kept in float
    as passing needs (sensitivity.mixed_precision). The built-in calibration and evaluation
    texts unless given. Raises VariantError when none passes (nothing is left at `dst`)."""
    calibration = calibration or datasets.builtin_texts("calibration")
    evaluation = evaluation or datasets.builtin_texts("eval")
    base = evaluate.embed(evaluate.session(fp32), encoder, evaluation)

    def reader() -> calibrate.TextCalibrationReader:
        return calibrate.TextCalibrationReader(encoder, calibration)

    def accuracy(path: Path) -> evaluate.Accuracy:
        return evaluate.accuracy(base, evaluate.embed(evaluate.session(path), encoder, evaluation))

    measured: list[evaluate.Accuracy] = []  # the last is the file now at `dst`

    def passes(path: Path) -> bool:
        measured.append(accuracy(path))
        return gate.passes(measured[-1])

    def dynamic(src: Path, out: Path, excluded: list[str]) -> None:
        quantize_int8(src, out, excluded)

    dynamic(fp32, dst, [])
    if passes(dst):
        return gate_record(dst, measured[-1], gate, calibration, evaluation, method=DYNAMIC)
    ranking = sensitivity.node_sensitivity(fp32, reader)
    method = DYNAMIC
    mixed = sensitivity.mixed_precision(fp32, dst, reader, ranking, passes, step=2, build=dynamic)
    if mixed is None:
        method = STATIC
        mixed = sensitivity.mixed_precision(fp32, dst, reader, ranking, passes)
    if mixed is None:
        raise VariantError(f"{fp32}: no set of FP32 nodes makes INT8 pass {gate}")
    path, excluded = mixed
    return gate_record(path, measured[-1], gate, calibration, evaluation, excluded, method)
