"""The tokenizer and chat template of a GGUF model, rebuilt from its metadata alone.

A GGUF carries no `tokenizer.json`: llama.cpp stores the vocabulary, the merges, the token
types, the special ids and the Jinja chat template as `tokenizer.*` keys. This module turns
them into a `tokenizer.json` for the HF `tokenizers` library and a `ChatFile`
(`tiermesh.generate.chat_file`) whose template renders like transformers'
`apply_chat_template`, so a worker serving the model needs neither transformers nor
llama.cpp. Only byte-level BPE (`tokenizer.ggml.model` = "gpt2") is built; the pre-tokenizer
follows llama.cpp's split rules for `tokenizer.ggml.pre`, which is how the merges were
learned. Called once per model when its files are prepared (`tiermesh models fetch`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import gguf

from tiermesh.generate.chat_file import ChatFile, ChatTemplate

# llama.cpp's token types (`llama_token_type`).
TOKEN_NORMAL = 1
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4

_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}

# How llama.cpp splits text for each `tokenizer.ggml.pre` (llama-vocab.cpp): the GPT-2 family
# with GPT-2's regex alone, the StarCoder family (SmolLM's) first isolating every digit.
_GPT2_FAMILY = frozenset({"gpt2", "default", "mpt", "olmo", "jais", "trillion"})
_DIGITS_FIRST_FAMILY = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)

# Control tokens that end generation whatever the file's eos id says: llama.cpp's list
# (llama-vocab.cpp), so a chat model that closes a turn with `<|endoftext|>` still stops.
_END_OF_GENERATION = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<|end_of_text|>",
        "<end_of_utterance>",
    }
)


class GgufTokenizerError(ValueError):
    """The GGUF describes no tokenizer, or one this module does not build."""


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (`bytes_to_unicode`) that byte-level BPE
    vocabularies are spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@dataclass(frozen=True)
class TokenizerMetadata:
    """The `tokenizer.*` keys of one GGUF, read once and shared by everything built here."""

    model: str
    pre: str | None
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    bos_token_id: int | None
    eos_token_id: int | None
    padding_token_id: int | None
    eot_token_id: int | None
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def _scalar(fields: Mapping[str, Any], key: str) -> Any:
    field = fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    return value[0].item()


def _strings(fields: Mapping[str, Any], key: str) -> tuple[str, ...]:
    # A string array's parts alternate length and bytes; `data` indexes the bytes parts.
    field = fields.get(key)
    if field is None:
        return ()
    return tuple(bytes(field.parts[i]).decode("utf-8") for i in field.data)


def _ints(fields: Mapping[str, Any], key: str) -> tuple[int, ...]:
    field = fields.get(key)
    if field is None:
        return ()
    return tuple(int(field.parts[i][0]) for i in field.data)


def read_tokenizer_metadata(source: Path | gguf.GGUFReader) -> TokenizerMetadata:
    """Read the tokenizer keys of the GGUF at `source`, a path or a reader already open on it
    (parsing the file takes seconds); raise `GgufTokenizerError` when there is no vocabulary
    or it is not byte-level BPE."""
    if isinstance(source, gguf.GGUFReader):
        fields, path = source.fields, Path(str(source.data.filename))
    else:
        path = source
        try:
            fields = gguf.GGUFReader(path).fields
        except (ValueError, OSError) as exc:
            raise GgufTokenizerError(f"{path}: not a readable GGUF file ({exc})") from exc
    model = _scalar(fields, "tokenizer.ggml.model")
    tokens = _strings(fields, "tokenizer.ggml.tokens")
    if model is None or not tokens:
        raise GgufTokenizerError(f"{path}: no tokenizer metadata (tokenizer.ggml.model/tokens)")
    if model != "gpt2":
        raise GgufTokenizerError(
            f"{path}: tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is built"
        )
    token_types = _ints(fields, "tokenizer.ggml.token_type") or (TOKEN_NORMAL,) * len(tokens)
    merges = _strings(fields, "tokenizer.ggml.merges")
    if len(token_types) != len(tokens) or not merges:
        raise GgufTokenizerError(f"{path}: token types or merges missing or inconsistent")

    def token_id(key: str) -> int | None:
        value = _scalar(fields, key)
        if value is None:
            return None
        if not 0 <= int(value) < len(tokens):
            raise GgufTokenizerError(f"{path}: {key}={value} outside the vocabulary")
        return int(value)

    return TokenizerMetadata(
        model=model,
        pre=_scalar(fields, "tokenizer.ggml.pre"),
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        bos_token_id=token_id("tokenizer.ggml.bos_token_id"),
        eos_token_id=token_id("tokenizer.ggml.eos_token_id"),
        padding_token_id=token_id("tokenizer.ggml.padding_token_id"),
        eot_token_id=token_id("tokenizer.ggml.eot_token_id"),
        add_bos_token=bool(_scalar(fields, "tokenizer.ggml.add_bos_token") or False),
        add_eos_token=bool(_scalar(fields, "tokenizer.ggml.add_eos_token") or False),
        chat_template=_scalar(fields, "tokenizer.chat_template"),
    )


def _pre_tokenizer(pre: str | None) -> dict[str, Any]:
    byte_level = {**_BYTE_LEVEL, "use_regex": True}
    name = pre or "default"
    if name in _GPT2_FAMILY:
        return byte_level
    if name in _DIGITS_FIRST_FAMILY:
        digits = {"type": "Digits", "individual_digits": True}
        return {"type": "Sequence", "pretokenizers": [digits, byte_level]}
    # llama.cpp refuses an unknown `pre` rather than guess; so do we, since a wrong split
    # gives valid-looking ids the model was never trained on.
    known = sorted(_GPT2_FAMILY | _DIGITS_FIRST_FAMILY)
    raise GgufTokenizerError(f"tokenizer.ggml.pre={pre!r} is not known; known: {known}")


def _post_processor(meta: TokenizerMetadata) -> dict[str, Any]:
    """BOS/EOS around each sequence, only where the file asks for them (llama.cpp's rule)."""
    special: dict[str, dict[str, Any]] = {}

    def around(sequence: str, type_id: int) -> list[dict[str, Any]]:
        pieces: list[dict[str, Any]] = [{"Sequence": {"id": sequence, "type_id": type_id}}]
        for flag, token_id, at_start in (
            (meta.add_bos_token, meta.bos_token_id, True),
            (meta.add_eos_token, meta.eos_token_id, False),
        ):
            if flag and token_id is not None:
                text = meta.tokens[token_id]
                special[text] = {"id": text, "ids": [token_id], "tokens": [text]}
                piece = {"SpecialToken": {"id": text, "type_id": type_id}}
                pieces = [piece, *pieces] if at_start else [*pieces, piece]
        return pieces

    single = around("A", 0)
    pair = [*single, *around("B", 1)]
    return {"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special}


def tokenizer_json(meta: TokenizerMetadata) -> str:
    """The `tokenizer.json` document for `meta` (see `tokenizer_json_from_gguf`)."""
    alphabet = _byte_alphabet()
    letters = set(alphabet.values())
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for index, (token, kind) in enumerate(zip(meta.tokens, meta.token_types, strict=True)):
        spelled = set(token) <= letters
        # A few converters store a token as its text; the BPE model looks it up byte-spelled.
        key = token if spelled else "".join(alphabet[b] for b in token.encode("utf-8"))
        vocab.setdefault(key, index)
        # Added tokens are matched whole in the raw text before BPE sees it. A control token
        # spelled outside the byte alphabet is a converter's mislabel (transformers skips it too).
        if (kind == TOKEN_CONTROL and spelled) or kind == TOKEN_USER_DEFINED:
            added.append(
                {
                    "id": index,
                    "content": token,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": kind == TOKEN_CONTROL,
                }
            )
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(meta.pre),
        "post_processor": _post_processor(meta),
        "decoder": {**_BYTE_LEVEL, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [merge.split(" ", 1) for merge in meta.merges],
        },
    }
    return json.dumps(document, ensure_ascii=False)


def tokenizer_json_from_gguf(path: Path) -> str:
    """A `tokenizer.json` for `tokenizers.Tokenizer.from_str` that encodes and decodes like the
    GGUF's own tokenizer: byte-level BPE with its vocabulary and merges, llama.cpp's
    pre-tokenizer for `tokenizer.ggml.pre`, control tokens matched whole as special tokens, and
    BOS/EOS added only where the file's `add_bos_token`/`add_eos_token` say so."""
    return tokenizer_json(read_tokenizer_metadata(path))


def stop_token_ids(source: Path | TokenizerMetadata) -> list[int]:
    """The ids that end generation, eos first: the file's eos and eot ids, then every control
    token llama.cpp treats as end-of-generation by its text (`<|im_end|>`, `<|endoftext|>`...)."""
    meta = source if isinstance(source, TokenizerMetadata) else read_tokenizer_metadata(source)
    ids = [i for i in (meta.eos_token_id, meta.eot_token_id) if i is not None]
    ids += [
        index
        for index, (token, kind) in enumerate(zip(meta.tokens, meta.token_types, strict=True))
        if kind == TOKEN_CONTROL and token in _END_OF_GENERATION
    ]
    return list(dict.fromkeys(ids))


def chat_template_from_metadata(meta: TokenizerMetadata) -> ChatTemplate:
    """The GGUF's chat template with the bos/eos token strings it may refer to; raises
    `GgufTokenizerError` when the file has none."""
    if not meta.chat_template:
        raise GgufTokenizerError("the GGUF has no tokenizer.chat_template")
    return ChatTemplate(
        template=meta.chat_template,
        bos_token=meta.token(meta.bos_token_id),
        eos_token=meta.token(meta.eos_token_id),
        eos_token_id=meta.eos_token_id,
    )


def chat_template_from_gguf(path: Path) -> ChatTemplate:
    return chat_template_from_metadata(read_tokenizer_metadata(path))


def chat_file_from_metadata(meta: TokenizerMetadata, context_length: int) -> ChatFile:
    """The `chat.json` of a model made from this GGUF (`tiermesh models fetch`)."""
    return ChatFile(chat_template_from_metadata(meta), tuple(stop_token_ids(meta)), context_length)
