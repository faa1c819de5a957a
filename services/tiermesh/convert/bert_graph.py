"""A BERT encoder as an ONNX graph, built node by node from a checkpoint's tensors.

Called by the MiniLM fetch to turn shipped safetensors into `model.onnx`; pure (tensors in,
bytes out), so the same weights always give the same bytes. The graph follows BERT's
eager semantics exactly: embeddings (word + position + token type 0) -> LayerNorm, then per
layer self-attention with an additive key mask of (1 - mask) * float32 min, output dense +
residual + LayerNorm, and a feed-forward block with the exact (erf) GELU. The pooler is left
out: callers pool `last_hidden_state` themselves.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tiermesh.convert.onnx_graph import GraphBuilder

PRODUCER = "tiermesh.convert.bert_graph"
PRODUCER_VERSION = "1"

# HF BERT adds finfo(float32).min to masked keys' scores; after softmax's max subtraction
# their exp() underflows to exactly 0, so padding never leaks into real tokens.
MASK_BIAS = float(np.finfo(np.float32).min)


class CheckpointError(ValueError):
    """The tensors do not form the BERT checkpoint the config describes."""


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise CheckpointError(
                f"hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_attention_heads}"
            )

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> BertConfig:
        """From a HF `config.json` mapping; refuses variants this graph does not build."""
        if raw.get("model_type", "bert") != "bert":
            raise CheckpointError(f"model_type {raw.get('model_type')!r} is not 'bert'")
        if raw.get("hidden_act", "gelu") != "gelu":
            raise CheckpointError(f"hidden_act {raw.get('hidden_act')!r}: only exact 'gelu'")
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError("only absolute position embeddings are supported")
        try:
            return cls(
                vocab_size=int(raw["vocab_size"]),
                hidden_size=int(raw["hidden_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=int(raw["num_attention_heads"]),
                intermediate_size=int(raw["intermediate_size"]),
                max_position_embeddings=int(raw["max_position_embeddings"]),
                type_vocab_size=int(raw["type_vocab_size"]),
                layer_norm_eps=float(raw["layer_norm_eps"]),
            )
        except KeyError as e:
            raise CheckpointError(f"config lacks {e.args[0]!r}") from None

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def expected_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the graph reads, by its HF checkpoint name, with its shape."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, h),
        "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for proj in ("query", "key", "value"):
            shapes[f"{p}attention.self.{proj}.weight"] = (h, h)
            shapes[f"{p}attention.self.{proj}.bias"] = (h,)
        shapes[f"{p}attention.output.dense.weight"] = (h, h)
        shapes[f"{p}attention.output.dense.bias"] = (h,)
        shapes[f"{p}attention.output.LayerNorm.weight"] = (h,)
        shapes[f"{p}attention.output.LayerNorm.bias"] = (h,)
        shapes[f"{p}intermediate.dense.weight"] = (i, h)
        shapes[f"{p}intermediate.dense.bias"] = (i,)
        shapes[f"{p}output.dense.weight"] = (h, i)
        shapes[f"{p}output.dense.bias"] = (h,)
        shapes[f"{p}output.LayerNorm.weight"] = (h,)
        shapes[f"{p}output.LayerNorm.bias"] = (h,)
    return shapes


def _checked(weights: Mapping[str, np.ndarray], cfg: BertConfig) -> dict[str, np.ndarray]:
    # Checkpoints saved from BertFor* heads prefix the encoder's names with "bert.".
    if "embeddings.word_embeddings.weight" not in weights:
        weights = {k.removeprefix("bert."): v for k, v in weights.items()}
    out: dict[str, np.ndarray] = {}
    problems: list[str] = []
    for name, shape in expected_shapes(cfg).items():
        if name not in weights:
            problems.append(f"missing {name}")
        elif tuple(weights[name].shape) != shape:
            problems.append(f"{name} has shape {tuple(weights[name].shape)}, expected {shape}")
        else:
            out[name] = np.ascontiguousarray(weights[name], dtype=np.float32)
    if problems:
        shown = "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else "")
        raise CheckpointError(f"{len(problems)} checkpoint problem(s): {shown}")
    return out


class _Graph(GraphBuilder):
    """The encoder's builder: torch-named weights, Linear layers."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.weights = weights

    def weight(self, key: str, transpose: bool = False) -> str:
        # torch Linear stores [out, in]; MatMul wants [in, out] as a constant initializer
        # so that dynamic quantization recognises it as a weight.
        value = self.weights[key]
        return self.const(key, np.ascontiguousarray(value.T) if transpose else value)

    def linear(self, x: str, key: str, out: str) -> str:
        y = self.op("MatMul", [x, self.weight(f"{key}.weight", transpose=True)], f"{out}/matmul")
        return self.op("Add", [y, self.weight(f"{key}.bias")], out)

    def layer_norm(self, x: str, key: str, out: str, eps: float) -> str:
        scale, bias = self.weight(f"{key}.weight"), self.weight(f"{key}.bias")
        return self.op("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=eps)


def _embeddings(g: _Graph, cfg: BertConfig) -> str:
    word = g.op("Gather", [g.weight("embeddings.word_embeddings.weight"), "input_ids"], "emb/word")
    shape = g.op("Shape", ["input_ids"], "emb/shape")
    seq_len = g.op("Gather", [shape, g.const("one_i64", np.array(1, np.int64))], "emb/seq_len")
    zero = g.const("zero_i64", np.array(0, np.int64))
    positions = g.op("Range", [zero, seq_len, "one_i64"], "emb/position_ids")
    pos = g.op("Gather", [g.weight("embeddings.position_embeddings.weight"), positions], "emb/pos")
    token_types = g.op(
        "ConstantOfShape",
        [shape],
        "emb/token_type_ids",
        value=numpy_helper.from_array(np.zeros(1, np.int64)),
    )
    types = g.op(
        "Gather", [g.weight("embeddings.token_type_embeddings.weight"), token_types], "emb/type"
    )
    summed = g.op("Add", [g.op("Add", [word, pos], "emb/word_pos"), types], "emb/sum")
    return g.layer_norm(summed, "embeddings.LayerNorm", "emb/out", cfg.layer_norm_eps)


def _mask_bias(g: _Graph) -> str:
    """[batch, 1, 1, seq]: 0 where the key is a real token, float32 min where it is padding."""
    mask = g.op("Cast", ["attention_mask"], "mask/float", to=TensorProto.FLOAT)
    inverted = g.op("Sub", [g.const("one_f32", np.array(1.0, np.float32)), mask], "mask/inverted")
    bias = g.op("Mul", [inverted, g.const("mask_min", np.array(MASK_BIAS, np.float32))], "mask/b")
    axes = g.const("mask_axes", np.array([1, 2], np.int64))
    return g.op("Unsqueeze", [bias, axes], "mask/bias")


def _attention(g: _Graph, cfg: BertConfig, x: str, bias: str, n: int) -> str:
    p, key = f"l{n}/attn", f"encoder.layer.{n}.attention"
    heads = g.const(
        f"{p}/heads_shape", np.array([0, 0, cfg.num_attention_heads, cfg.head_size], np.int64)
    )

    def split(proj: str, perm: list[int]) -> str:
        y = g.linear(x, f"{key}.self.{proj}", f"{p}/{proj}")
        return g.op("Transpose", [g.op("Reshape", [y, heads], f"{y}/heads")], f"{y}/t", perm=perm)

    q = split("query", [0, 2, 1, 3])  # [B, heads, S, d]
    k = split("key", [0, 2, 3, 1])  # [B, heads, d, S]
    v = split("value", [0, 2, 1, 3])  # [B, heads, S, d]
    scores = g.op("MatMul", [q, k], f"{p}/scores")
    root = g.const(f"{p}/sqrt_d", np.array(math.sqrt(cfg.head_size), np.float32))
    scaled = g.op("Div", [scores, root], f"{p}/scaled")
    probs = g.op("Softmax", [g.op("Add", [scaled, bias], f"{p}/masked")], f"{p}/probs", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{p}/context")
    merged = g.op("Transpose", [ctx], f"{p}/context_t", perm=[0, 2, 1, 3])
    hidden = g.const(f"{p}/hidden_shape", np.array([0, 0, cfg.hidden_size], np.int64))
    flat = g.op("Reshape", [merged, hidden], f"{p}/context_flat")
    out = g.linear(flat, f"{key}.output.dense", f"{p}/out")
    res = g.op("Add", [out, x], f"{p}/residual")
    return g.layer_norm(res, f"{key}.output.LayerNorm", f"{p}/norm", cfg.layer_norm_eps)


def _feed_forward(g: _Graph, cfg: BertConfig, x: str, n: int, out_name: str) -> str:
    p, key = f"l{n}/ffn", f"encoder.layer.{n}"
    h = g.linear(x, f"{key}.intermediate.dense", f"{p}/in")
    # exact GELU: 0.5 * h * (1 + erf(h / sqrt(2)))
    erf = g.op(
        "Erf",
        [g.op("Div", [h, g.const(f"{p}/sqrt2", np.array(math.sqrt(2.0), np.float32))], f"{p}/s")],
        f"{p}/erf",
    )
    one_plus = g.op("Add", [erf, "one_f32"], f"{p}/erf1")
    half = g.op("Mul", [h, g.const(f"{p}/half", np.array(0.5, np.float32))], f"{p}/half_h")
    gelu = g.op("Mul", [half, one_plus], f"{p}/gelu")
    out = g.linear(gelu, f"{key}.output.dense", f"{p}/out")
    res = g.op("Add", [out, x], f"{p}/residual")
    return g.layer_norm(res, f"{key}.output.LayerNorm", out_name, cfg.layer_norm_eps)


def build_bert_onnx(weights: Mapping[str, np.ndarray], config: BertConfig) -> bytes:
    """The serialized ONNX model (opset 17) of the encoder in `weights`.

    Inputs `input_ids`, `attention_mask` (INT64 [batch, sequence]); output
    `last_hidden_state` (FP32 [batch, sequence, hidden]). Token type ids are all 0 and
    position ids are 0..sequence-1, both made inside the graph. Raises CheckpointError when
    a tensor is missing or has the wrong shape. Deterministic: equal inputs, equal bytes.
    """
    g = _Graph(_checked(weights, config))
    x = _embeddings(g, config)
    bias = _mask_bias(g)
    for n in range(config.num_hidden_layers):
        last = n == config.num_hidden_layers - 1
        x = _attention(g, config, x, bias, n)
        x = _feed_forward(g, config, x, n, "last_hidden_state" if last else f"l{n}/out")
    if config.num_hidden_layers == 0:
        x = g.op("Identity", [x], "last_hidden_state")
    model = g.model(
        "bert_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
            helper.make_tensor_value_info(
                "attention_mask", TensorProto.INT64, ["batch", "sequence"]
            ),
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", config.hidden_size]
            )
        ],
        (PRODUCER, PRODUCER_VERSION),
    )
    return bytes(model.SerializeToString())
