"""Precision / graph variants of an ONNX model, each built from the FP32 `src` into `dst`.

Every builder writes `dst` atomically (a scratch file beside it, then a rename), returns
`dst`, and raises `VariantError` naming the variant and the cause when onnxruntime or onnx
refuses. The inputs and outputs keep their names and FP32/INT64 types in every variant.

- `graph_optimized`: onnxruntime's offline graph optimisation at the *extended* level
  (constant folding, redundant-node removal, fusions into `com.microsoft` ops such as
  SkipLayerNormalization, BiasGelu, FusedMatMul, Attention). The level stops below
  ORT_ENABLE_ALL on purpose: the "all" level adds layout transformations for the CPU it
  runs on (NCHWc), which onnxruntime documents as not portable in a saved model. The file
  needs onnxruntime (contrib ops) and should be loaded with
  `graph_optimization_level = ORT_DISABLE_ALL` or `ORT_ENABLE_BASIC`; re-running the
  extended passes on it is harmless but wasted start-up time.
- `fp16`: weights and compute in float16 (`onnxruntime.transformers.float16`), inputs and
  outputs left FP32 (Cast nodes at the edges). On CPUs without native FP16 arithmetic
  onnxruntime may be *slower* than FP32; the variant is mostly for GPUs and for size.
- `int8_dynamic`: the repository's `model.int8.onnx` recipe (QInt8 weights, per channel,
  reduced range, MatMul/Gemm; activations quantized at run time).
- `int8_static`: QDQ format, calibrated MinMax ranges; QInt8 weights (per channel,
  symmetric) and QUInt8 activations (asymmetric), the U8S8 pairing the CPU execution
  provider runs with its integer kernels; reduced range for the same AVX2 reason as the
  dynamic recipe. Only MatMul/Gemm are quantized; `exclude_nodes` stay float.
- `int4_weight_only`: MatMul weights in 4-bit blocks (`MatMulNBits`, symmetric, one scale
  per `block_size` values along K); activations and compute stay float.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)

from tiermesh.convert.minilm import quantize_int8, quiet_quantizer_hints
from tiermesh.core.sessions import open_session, session_options

QUANTIZED_OP_TYPES = ("MatMul", "Gemm")


class VariantError(RuntimeError):
    """A variant could not be built; the message names the variant, the source and why."""


@contextmanager
def _building(kind: str, src: Path, dst: Path) -> Iterator[Path]:
    """Scratch path for `dst`; on success it replaces `dst`, on any failure a VariantError."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise VariantError(f"{kind}: source model {src} does not exist")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as tmp:
        out = Path(tmp) / dst.name
        try:
            yield out
        except VariantError:
            raise
        except Exception as e:
            raise VariantError(f"{kind}: building from {src} failed: {e}") from e
        if not out.is_file():
            raise VariantError(f"{kind}: building from {src} wrote no model")
        out.replace(dst)


def _node_names(model_path: Path, op_types: Sequence[str] | None = None) -> list[str]:
    model = onnx.load(str(model_path), load_external_data=False)
    return [n.name for n in model.graph.node if op_types is None or n.op_type in op_types]


def graph_optimized(src: Path, dst: Path) -> Path:
    """`src` after onnxruntime's extended graph optimisations, saved offline (see module
    docstring: load it with graph optimisation disabled or basic)."""
    with _building("graph_optimized", src, dst) as out:
        opts = session_options(1)
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        opts.optimized_model_filepath = str(out)
        open_session(src, opts)
    return dst


def fp16(src: Path, dst: Path) -> Path:
    """Float16 weights and compute, FP32 inputs/outputs (`keep_io_types=True`)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with _building("fp16", src, dst) as out:
        model = onnx.load(str(src))
        converted = convert_float_to_float16(model, keep_io_types=True)
        onnx.save(converted, str(out))
    return dst


def int8_dynamic(src: Path, dst: Path) -> Path:
    """Dynamic INT8 (the `tiermesh models fetch` recipe, `convert.minilm.quantize_int8`)."""
    with _building("int8_dynamic", src, dst) as out:
        quantize_int8(Path(src), out)
    return dst


def int8_static(
    src: Path,
    dst: Path,
    reader: CalibrationDataReader,
    exclude_nodes: Sequence[str] = (),
) -> Path:
    """Static INT8 in QDQ format, calibrated on `reader` (MinMax); the MatMul/Gemm nodes
    named in `exclude_nodes` keep float inputs and weights."""
    excluded = list(dict.fromkeys(exclude_nodes))
    with _building("int8_static", src, dst) as out:
        unknown = sorted(set(excluded) - set(_node_names(Path(src))))
        if unknown:
            raise VariantError(f"int8_static: {src} has no nodes named {unknown}")
        with quiet_quantizer_hints():
            quantize_static(
                str(src),
                str(out),
                reader,
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(QUANTIZED_OP_TYPES),
                per_channel=True,
                reduce_range=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=excluded,
                calibrate_method=CalibrationMethod.MinMax,
                extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
            )
    return dst


def int4_weight_only(src: Path, dst: Path, block_size: int = 32) -> Path:
    """4-bit block-wise MatMul weights (`MatMulNBits`), activations float."""
    if block_size < 16 or block_size & (block_size - 1):
        raise VariantError(
            f"int4_weight_only: block_size must be a power of two >= 16, got {block_size}"
        )
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as e:  # onnx_ir is a separate package
        raise VariantError(
            f"int4_weight_only: onnxruntime's INT4 quantizer is unavailable: {e}"
        ) from e
    with _building("int4_weight_only", src, dst) as out:
        quantizer = MatMulNBitsQuantizer(
            onnx.load(str(src)),
            bits=4,
            block_size=block_size,
            is_symmetric=True,
            op_types_to_quantize=("MatMul",),
        )
        with quiet_quantizer_hints():
            quantizer.process()
        quantizer.model.save_model_to_file(str(out), use_external_data_format=False)
    return dst


BUILDERS: dict[str, Callable[[Path, Path], Path]] = {
    "graph_optimized": graph_optimized,
    "fp16": fp16,
    "int8_dynamic": int8_dynamic,
    "int4_weight_only": int4_weight_only,
}
