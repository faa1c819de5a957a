"""The llama GGUF -> ONNX decoder against transformers loading the same tiny GGUF file.

The GGUF is written by tests/tiny_llama.py the way llama.cpp's converter writes one, Q/K
rows permuted for ggml's rope; transformers undoes that permutation on load, so agreement
checks our un-permutation too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_llama import (
    FFN,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    KV_HEADS,
    LAYERS,
    VOCAB,
    hf_tensors,
    write_tiny_gguf,
)
from tiermesh.convert.llama import (
    GgufLlamaError,
    LlamaWeights,
    build_decoder,
    convert_gguf,
    read_gguf_llama,
)
from tiermesh.worker.runner import session_options

GGUF_NAME = "tiny-llama.gguf"
TOL = 1e-4


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tiny_llama")
    write_tiny_gguf(d / GGUF_NAME)
    return d


@pytest.fixture(scope="module")
def weights(tiny_dir: Path) -> LlamaWeights:
    return read_gguf_llama(tiny_dir / GGUF_NAME)


@pytest.fixture(scope="module")
def session(tiny_dir: Path) -> ort.InferenceSession:
    out = tiny_dir / "model.onnx"
    convert_gguf(tiny_dir / GGUF_NAME, out)
    return ort.InferenceSession(str(out), session_options(1), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> torch.nn.Module:
    # from_pretrained returns the model in eval mode
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
        tiny_dir, gguf_file=GGUF_NAME, dtype=torch.float32, attn_implementation="eager"
    )
    return model


def _empty_past(batch: int) -> dict[str, np.ndarray]:
    empty = np.zeros((batch, KV_HEADS, 0, HEAD_DIM), np.float32)
    return {f"past_key_values.{n}.{t}": empty for n in range(LAYERS) for t in ("key", "value")}


def _run(
    sess: ort.InferenceSession,
    ids: np.ndarray,
    mask: np.ndarray,
    positions: np.ndarray,
    past: dict[str, np.ndarray],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
    names = [o.name for o in sess.get_outputs()]
    values = dict(zip(names, sess.run(names, feeds), strict=True))
    present = {
        f"past_key_values.{n}.{t}": values[f"present.{n}.{t}"]
        for n in range(LAYERS)
        for t in ("key", "value")
    }
    return values["logits"], present


def _prefill(sess: ort.InferenceSession, ids: np.ndarray) -> np.ndarray:
    batch, seq = ids.shape
    positions = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
    logits, _ = _run(sess, ids, np.ones_like(ids), positions, _empty_past(batch))
    return logits


def _ids(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int64)


def test_reads_hyper_parameters_and_dequantized_tensors(weights: LlamaWeights) -> None:
    assert (weights.n_layers, weights.hidden_size, weights.n_heads, weights.n_kv_heads) == (
        LAYERS,
        HIDDEN,
        HEADS,
        KV_HEADS,
    )
    assert (weights.head_dim, weights.intermediate_size, weights.vocab_size) == (
        HEAD_DIM,
        FFN,
        VOCAB,
    )
    assert weights.rope_theta == 100000.0 and weights.context_length == 256
    assert weights.rms_norm_eps == pytest.approx(1e-5)
    assert weights.tied_embeddings
    assert weights.tensors["blk.1.ffn_down.weight"].shape == (HIDDEN, FFN)
    np.testing.assert_array_equal(
        weights.tensors["token_embd.weight"], hf_tensors()["token_embd.weight"]
    )


def test_lm_head_reuses_the_embedding_initializer(weights: LlamaWeights) -> None:
    graph = build_decoder(weights).graph
    names = [i.name for i in graph.initializer]
    assert names.count("token_embd.weight") == 1
    assert len(names) == len(set(names))
    gemm = next(n for n in graph.node if n.op_type == "Gemm")
    assert gemm.input[1] == "token_embd.weight"


def test_prefill_logits_match_transformers(
    session: ort.InferenceSession, reference: torch.nn.Module
) -> None:
    ids = _ids(1, 2, 9)
    with torch.no_grad():
        expected = reference(input_ids=torch.from_numpy(ids)).logits.numpy()
    got = _prefill(session, ids)
    assert got.shape == (2, 9, VOCAB)
    assert np.abs(expected).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)


def test_decoding_through_the_cache_equals_one_full_prefill(
    session: ort.InferenceSession,
) -> None:
    ids = _ids(2, 1, 10)
    full = _prefill(session, ids)
    prefix = 4
    positions = np.arange(prefix, dtype=np.int64)[None, :]
    mask = np.ones((1, prefix), np.int64)
    logits, past = _run(session, ids[:, :prefix], mask, positions, _empty_past(1))
    steps = [logits]
    for pos in range(prefix, ids.shape[1]):
        assert past["past_key_values.0.key"].shape == (1, KV_HEADS, pos, HEAD_DIM)
        mask = np.ones((1, pos + 1), np.int64)
        logits, past = _run(session, ids[:, pos : pos + 1], mask, np.array([[pos]]), past)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=TOL)


def test_left_padded_batch_matches_each_row_alone(session: ort.InferenceSession) -> None:
    short, long = _ids(3, 5), _ids(4, 8)
    pad = long.size - short.size
    ids = np.stack([np.concatenate([np.zeros(pad, np.int64), short]), long])
    mask = np.ones_like(ids)
    mask[0, :pad] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)  # as HF generate makes them
    logits, past = _run(session, ids, mask, positions, _empty_past(2))
    alone = [_prefill(session, row[None, :]) for row in (short, long)]
    for row in range(2):
        np.testing.assert_allclose(logits[row, -1], alone[row][0, -1], rtol=0, atol=TOL)
    # one decode step on top of the padded cache still matches
    nxt = np.array([[7], [11]], np.int64)
    mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    step, _ = _run(session, nxt, mask, positions[:, -1:] + 1, past)
    for row, seq in enumerate((short, long)):
        expected = _prefill(session, np.concatenate([seq, nxt[row]])[None, :])[0, -1]
        np.testing.assert_allclose(step[row, -1], expected, rtol=0, atol=TOL)


def test_right_padding_leaves_real_positions_alone(session: ort.InferenceSession) -> None:
    short, long = _ids(5, 3), _ids(6, 6)
    ids = np.stack([np.concatenate([short, np.zeros(3, np.int64)]), long])
    mask = np.ones_like(ids)
    mask[0, 3:] = 0
    positions = np.tile(np.arange(6, dtype=np.int64), (2, 1))
    logits, _ = _run(session, ids, mask, positions, _empty_past(2))
    assert np.isfinite(logits).all()
    np.testing.assert_allclose(logits[0, :3], _prefill(session, short[None])[0], atol=TOL, rtol=0)
    np.testing.assert_allclose(logits[1], _prefill(session, long[None])[0], atol=TOL, rtol=0)


def test_garbage_file_raises_the_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"PK\x03\x04 certainly not a model" * 10)
    with pytest.raises(GgufLlamaError, match="not a GGUF"):
        read_gguf_llama(junk)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00\xff")
    with pytest.raises(GgufLlamaError):
        read_gguf_llama(truncated)


def test_other_architecture_raises_the_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "other.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(GgufLlamaError, match="architecture is 'gpt2'"):
        read_gguf_llama(path)


def test_missing_tensor_raises_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "holey.gguf"
    write_tiny_gguf(path, drop="blk.1.ffn_up.weight")
    with pytest.raises(GgufLlamaError, match=r"missing blk\.1\.ffn_up\.weight"):
        convert_gguf(path, tmp_path / "model.onnx")
    assert list(tmp_path.iterdir()) == [path]
