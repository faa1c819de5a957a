"""A tiny random llama GGUF written the way llama.cpp's converter writes one: tensor names
`token_embd`, `output_norm`, `blk.N.{attn_norm,attn_q,attn_k,attn_v,attn_output,ffn_norm,
ffn_gate,ffn_up,ffn_down}.weight`, the `llama.*` metadata keys, no `output.weight` (tied
lm_head), and Q/K rows permuted for ggml's rope (llama.cpp's `LlamaModel.permute`). For the
converter's tests and the generation engine's (a decoder converted in a second)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 64, 4, 2, 128, 300
HEAD_DIM = HIDDEN // HEADS


def _ggml_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py: rows of each head from halves into adjacent pairs."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_tensors(seed: int = 3) -> dict[str, np.ndarray]:
    """Random weights in HF layout ([out, in]), keyed by GGUF name."""
    rng = np.random.default_rng(seed)

    def t(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "token_embd.weight": t(VOCAB, HIDDEN, scale=1.0),
        "output_norm.weight": 1 + t(HIDDEN, scale=0.1),
    }
    for n in range(LAYERS):
        p = f"blk.{n}."
        w[f"{p}attn_norm.weight"] = 1 + t(HIDDEN, scale=0.1)
        w[f"{p}attn_q.weight"] = t(HEADS * HEAD_DIM, HIDDEN, scale=0.5 / HIDDEN**0.5)
        w[f"{p}attn_k.weight"] = t(KV_HEADS * HEAD_DIM, HIDDEN, scale=0.5 / HIDDEN**0.5)
        w[f"{p}attn_v.weight"] = t(KV_HEADS * HEAD_DIM, HIDDEN, scale=1 / HIDDEN**0.5)
        w[f"{p}attn_output.weight"] = t(HIDDEN, HEADS * HEAD_DIM, scale=0.5 / HIDDEN**0.5)
        w[f"{p}ffn_norm.weight"] = 1 + t(HIDDEN, scale=0.1)
        w[f"{p}ffn_gate.weight"] = t(FFN, HIDDEN, scale=1 / HIDDEN**0.5)
        w[f"{p}ffn_up.weight"] = t(FFN, HIDDEN, scale=1 / HIDDEN**0.5)
        w[f"{p}ffn_down.weight"] = t(HIDDEN, FFN, scale=0.5 / FFN**0.5)
    return w


def write_tiny_gguf(path: Path, arch: str = "llama", drop: str = "") -> None:
    tensors = hf_tensors()
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_vocab_size(VOCAB)
    # transformers reads a tokenizer from any GGUF; a byte-level BPE without merges will do.
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"t{i}" for i in range(VOCAB)])
    writer.add_token_merges(["t 1"])
    writer.add_token_types([1] * VOCAB)
    for name, value in tensors.items():
        if name == drop:
            continue
        if ".attn_q." in name:
            value = _ggml_permute(value, HEADS)
        elif ".attn_k." in name:
            value = _ggml_permute(value, KV_HEADS)
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
