"""Gate records (core/gates.py) from measurements, and the INT8 variant a repository ships:
static INT8 with the fewest most-sensitive nodes kept in FP32 that passes the gate.

Used by `tiermesh optimize` (a record beside each variant it writes) and `tiermesh models
fetch` (the MiniLM `int8` variant and its record).
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path

from tiermesh.core.gates import GateRecord
from tiermesh.core.repository import sha256_file
from tiermesh.optimize import calibrate, datasets, evaluate, sensitivity
from tiermesh.optimize.gate import Gate
from tiermesh.optimize.variants import VariantError
from tiermesh.router.text import TextEncoder

DEFAULT_GATE = Gate("cosine", 0.99)


def gate_record(
    path: Path,
    acc: evaluate.Accuracy,
    gate: Gate,
    calibration: Sequence[str],
    evaluation: Sequence[str],
    excluded_nodes: Sequence[str] = (),
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
    )


def gated_int8(
    fp32: Path,
    dst: Path,
    encoder: TextEncoder,
    gate: Gate = DEFAULT_GATE,
    calibration: Sequence[str] | None = None,
    evaluation: Sequence[str] | None = None,
) -> GateRecord:
    """Static INT8 of `fp32` at `dst`, with as few of its most sensitive MatMul/Gemm nodes
    kept in float as passing `gate` needs (sensitivity.mixed_precision), and its record.
    The built-in calibration and evaluation texts unless given. Raises VariantError when
    no such model passes (nothing is left at `dst`)."""
    calibration = calibration or datasets.builtin_texts("calibration")
    evaluation = evaluation or datasets.builtin_texts("eval")
    base = evaluate.embed(evaluate.session(fp32), encoder, evaluation)

    def reader() -> calibrate.TextCalibrationReader:
        return calibrate.TextCalibrationReader(encoder, calibration)

    def accuracy(path: Path) -> evaluate.Accuracy:
        return evaluate.accuracy(base, evaluate.embed(evaluate.session(path), encoder, evaluation))

    ranking = sensitivity.node_sensitivity(fp32, reader)
    mixed = sensitivity.mixed_precision(
        fp32, dst, reader, ranking, lambda path: gate.passes(accuracy(path))
    )
    if mixed is None:
        raise VariantError(f"{fp32}: no set of FP32 nodes makes INT8 pass {gate}")
    path, excluded = mixed
    return gate_record(path, accuracy(path), gate, calibration, evaluation, excluded)
