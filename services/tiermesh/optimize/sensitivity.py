"""Which MatMul/Gemm nodes lose most when quantized, and a static INT8 model that keeps just
enough of them in float to pass an accuracy gate.

`node_sensitivity` calibrates and quantizes the whole model once (`variants.int8_static`),
then measures, with `onnxruntime.quantization.qdq_loss_debug`, how much relative noise the
quantization puts on each candidate node's inputs:

- activations: the QDQ model is augmented (`modify_model_output_intermediate_tensors`) to
  expose every QuantizeLinear input and DequantizeLinear output; the calibration batches
  are run one at a time and `create_activation_matching` pairs each activation before and
  after its QDQ; noise and signal energies are summed over all batches (nothing is kept, so
  memory stays at one batch);
- weights: `create_weight_matching` / `compute_weight_error` give each weight's SQNR.

A node's score is the sum over its quantized inputs of noise/signal energy
(10^(-SQNR/10)): the relative error the node's own quantization adds, a local measure that
ignores how later layers amplify it, but costs one calibration and one pass of the data
(on all-MiniLM-L6-v2 with the shipped calibration set, seconds on 2 cores, where
quantizing one node at a time would mean 48 calibrations). Higher = more sensitive.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader
from onnxruntime.quantization.qdq_loss_debug import (
    compute_weight_error,
    create_activation_matching,
    create_weight_matching,
    modify_model_output_intermediate_tensors,
)

from tiermesh.core.sessions import open_session, session_options
from tiermesh.optimize.variants import QUANTIZED_OP_TYPES, VariantError, int8_static


def _candidates(model: onnx.ModelProto, candidates: Sequence[str] | None) -> list[str]:
    quantizable = [n.name for n in model.graph.node if n.op_type in QUANTIZED_OP_TYPES]
    if candidates is None:
        return quantizable
    chosen = list(dict.fromkeys(candidates))
    unknown = sorted(set(chosen) - set(quantizable))
    if unknown:
        raise ValueError(f"not quantizable {'/'.join(QUANTIZED_OP_TYPES)} nodes: {unknown}")
    return chosen


def _activation_noise(
    augmented: Path, reader: CalibrationDataReader
) -> dict[str, tuple[float, float]]:
    """(signal energy, QDQ noise energy) of each quantized activation over all batches."""
    model = onnx.load(str(augmented), load_external_data=False)
    outputs = {o.name for o in model.graph.output}
    # The augmentation adds one Reshape per saved tensor whose output is a graph output.
    saved = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "Reshape" and n.output and n.output[0] in outputs
    }
    opts = session_options(2)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = open_session(augmented, opts).session
    names = [o.name for o in session.get_outputs() if o.name in saved]
    totals: dict[str, tuple[float, float]] = {}
    while (batch := reader.get_next()) is not None:
        values = session.run(names, batch)
        acts = {saved[name]: [np.asarray(v)] for name, v in zip(names, values, strict=True)}
        for tensor, match in create_activation_matching(acts).items():
            pre = np.asarray(match["pre_qdq"][0], np.float64)
            post = np.asarray(match["post_qdq"][0], np.float64)
            signal, noise = totals.get(tensor, (0.0, 0.0))
            totals[tensor] = (
                signal + float(np.sum(pre * pre)),
                noise + float(np.sum((pre - post) ** 2)),
            )
    if not totals:
        raise VariantError("node_sensitivity: the calibration reader gave no batches")
    return totals


def node_sensitivity(
    fp32: Path,
    reader_factory: Callable[[], CalibrationDataReader],
    candidates: Sequence[str] | None = None,
) -> list[tuple[str, float]]:
    """(node name, score) for every candidate (default: every MatMul/Gemm), most sensitive
    first; the score is the relative quantization noise on the node's inputs (see module
    docstring). `reader_factory` is called twice (calibration, measurement)."""
    fp32 = Path(fp32)
    model = onnx.load(str(fp32), load_external_data=False)
    chosen = _candidates(model, candidates)
    initializers = {t.name for t in model.graph.initializer}
    with tempfile.TemporaryDirectory(prefix="tiermesh-sensitivity-") as tmp:
        qdq = Path(tmp) / "qdq.onnx"
        int8_static(fp32, qdq, reader_factory())
        augmented = Path(tmp) / "augmented.onnx"
        modify_model_output_intermediate_tensors(
            str(qdq), str(augmented), op_types_for_saving=["QuantizeLinear", "DequantizeLinear"]
        )
        activations = _activation_noise(augmented, reader_factory())
        weight_sqnr = compute_weight_error(create_weight_matching(str(fp32), str(qdq)))

    def relative_noise(tensor: str) -> float:
        if tensor in initializers:
            sqnr = weight_sqnr.get(tensor)
            return 0.0 if sqnr is None else float(10.0 ** (-sqnr / 10.0))
        signal, noise = activations.get(tensor, (0.0, 0.0))
        return noise / signal if signal > 0 else 0.0

    nodes = {n.name: n for n in model.graph.node}
    scores = [(name, sum(relative_noise(t) for t in nodes[name].input if t)) for name in chosen]
    return sorted(scores, key=lambda item: (-item[1], item[0]))


def mixed_precision(
    fp32: Path,
    dst: Path,
    reader_factory: Callable[[], CalibrationDataReader],
    ranking: Sequence[tuple[str, float]],
    passes: Callable[[Path], bool],
    max_excluded: int = 24,
    step: int = 4,
    build: Callable[[Path, Path, list[str]], object] | None = None,
) -> tuple[Path, list[str]] | None:
    """Static INT8 at `dst` with the fewest most-sensitive nodes (first of `ranking`) kept
    float such that `passes(dst)`: tries 0, step, 2*step, ... up to max_excluded (capped at
    the ranking's length), re-calibrating each time with a fresh reader. `build(fp32, dst,
    excluded)` makes another kind of INT8 instead (dynamic: no calibration). Returns
    (dst, excluded nodes), or None, with `dst` removed, when even the last try fails."""
    if step < 1:
        raise ValueError(f"step must be at least 1, got {step}")
    dst = Path(dst)
    order = [name for name, _ in ranking]
    limit = min(max(max_excluded, 0), len(order))
    counts = [*range(0, limit, step), limit]
    for count in dict.fromkeys(counts):
        excluded = order[:count]
        if build is None:
            int8_static(fp32, dst, reader_factory(), exclude_nodes=excluded)
        else:
            build(fp32, dst, excluded)
        if passes(dst):
            return dst, excluded
    dst.unlink(missing_ok=True)
    return None
