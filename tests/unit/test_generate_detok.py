"""TextStream against whole-sequence decodes: a tiny byte-level BPE trained in a fixture (the
real `tokenizers` library), raw UTF-8 bytes as ids, a Metaspace decoder (a slice decodes
differently at its start), and SmolLM2's own tokenizer rebuilt from the cached GGUF (slow)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tiermesh.generate.detok import TextStream, for_tokenizer

Decode = Callable[[Sequence[int]], str]

CORPUS = [
    "hello world, the quick brown fox jumps over the lazy dog",
    "stop here STOP. User: what? Assistant: an answer\n\n",
    "你好世界\uff0c今天天气很好。こんにちは",
    "emoji 😀👍🏽 🇫🇷 👩‍💻 and e\u0301 combining",
]
END = "<|im_end|>"

# Text that tokenizes into multi-byte splits: emoji, CJK, combining marks, ZWJ sequences.
ALPHABET = st.sampled_from(list("abc xyz.\n") + list("你好世界😀👍🏽🇫🇷👩‍💻é\u0301\u00e9ß"))
TEXTS = st.text(alphabet=ALPHABET, max_size=40)


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return tokenizer


def bpe_decode(tok: Tokenizer) -> Decode:
    return lambda ids: tok.decode(list(ids), skip_special_tokens=True)


def special_id(tok: Tokenizer, token: str) -> int:
    found = tok.token_to_id(token)
    assert found is not None
    return found


def utf8_decode(ids: Sequence[int]) -> str:
    """Each id one byte: the harshest split of multi-byte characters."""
    return bytes(ids).decode("utf-8", errors="replace")


def run(stream: TextStream, ids: Sequence[int]) -> list[str]:
    """The pieces pushed out, then finish()'s rest."""
    return [stream.push(i) for i in ids] + [stream.finish()]


def expected_cut(text: str, stops: Sequence[str]) -> tuple[str, str | None]:
    """The text before the stop string in the shortest prefix of `text` that contains one
    (the longest of those ending there), computed the slow, obvious way."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if s and text[:end].endswith(s)]
        if ending:
            s = max(ending, key=len)
            return text[: end - len(s)], s
    return text, None


# --- Without stop strings: the pieces add up to the whole decode ------------------------------


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=TEXTS)
def test_pieces_add_up_to_the_whole_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text).ids
    decode = bpe_decode(tok)
    pieces = run(TextStream(decode), ids)
    full = decode(ids)
    assert full == text
    assert "".join(pieces) == full
    assert all("\ufffd" not in p for p in pieces)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_ids_add_up_to_the_whole_decode(tok: Tokenizer, data: st.DataObject) -> None:
    # Arbitrary ids make invalid UTF-8 (lone continuation bytes, cut-off sequences) and
    # special tokens: whatever the decode of the whole makes of them, the pieces agree.
    ids = data.draw(st.lists(st.integers(0, tok.get_vocab_size() - 1), max_size=30))
    decode = bpe_decode(tok)
    stream = TextStream(decode)
    pieces = run(stream, ids)
    full = decode(ids)
    assert "".join(pieces) == stream.text == full
    if "\ufffd" not in full:
        assert all("\ufffd" not in p for p in pieces)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=40))
def test_byte_ids_add_up_and_hold_back_cut_characters(data: bytes) -> None:
    stream = TextStream(utf8_decode)
    shown = ""
    for n, byte in enumerate(data, start=1):
        shown += stream.push(byte)
        # Shown: what decoding the bytes so far gives, less a trailing U+FFFD run.
        assert shown == utf8_decode(data[:n]).rstrip("\ufffd")
    assert shown + stream.finish() == utf8_decode(data)


def test_a_cut_emoji_is_held_until_its_last_byte() -> None:
    stream = TextStream(utf8_decode)
    pieces = [stream.push(b) for b in "a😀b".encode()]
    assert pieces == ["a", "", "", "", "😀", "b"]
    assert stream.finish() == ""
    assert stream.text == "a😀b"


def test_a_character_never_completed_is_released_by_finish_as_the_decode_has_it() -> None:
    stream = TextStream(utf8_decode)
    assert [stream.push(b) for b in b"ok\xf0\x9f"] == ["o", "k", "", ""]
    assert stream.finish() == "\ufffd"
    assert stream.text == "ok\ufffd"


def test_special_tokens_decode_to_nothing(tok: Tokenizer) -> None:
    ids = [*tok.encode("hi").ids, special_id(tok, END)]
    stream = for_tokenizer(tok)
    pieces = run(stream, ids)
    assert pieces[-2:] == ["", ""]
    assert stream.text == "hi"


@settings(max_examples=100, deadline=None)
@given(words=st.lists(st.sampled_from(["▁Hello", "▁world", "!", "▁", "s", "▁ok"]), max_size=20))
def test_a_decoder_that_drops_the_leading_space_of_a_slice(words: list[str]) -> None:
    # Metaspace (SentencePiece) drops the first token's "▁": decoding ids[read_offset:] alone
    # would lose the space between pieces; decoding from the prefix offset keeps it.
    vocab = sorted(set(words) | {"x"})
    metaspace = decoders.Metaspace()

    def decode(ids: Sequence[int]) -> str:
        return metaspace.decode([vocab[i] for i in ids])

    ids = [vocab.index(w) for w in words]
    assert "".join(run(TextStream(decode), ids)) == decode(ids)


def test_a_long_output_decodes_short_windows() -> None:
    decoded = 0

    def decode(ids: Sequence[int]) -> str:
        nonlocal decoded
        decoded += len(ids)
        return utf8_decode(ids)

    data = "long output 😀 你好 ".encode() * 200
    stream = TextStream(decode)
    assert "".join(run(stream, data)) == data.decode()
    # Whole-sequence decodes would touch ~n²/2 = 10**7 ids; windows stay a few tokens wide.
    assert decoded < 10 * len(data)


# --- Stop strings -----------------------------------------------------------------------------


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), text=TEXTS)
def test_output_is_the_text_before_the_first_stop_string(
    tok: Tokenizer, data: st.DataObject, text: str
) -> None:
    # Stop strings cut from the text itself (so they do occur, often across tokens), and some
    # that may not.
    def substring() -> str:
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 6)))
        return text[i:j] or "a"

    stops = [substring() for _ in range(data.draw(st.integers(0, 3)))]
    stops += data.draw(st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=4), max_size=2))
    ids = tok.encode(text).ids
    decode = bpe_decode(tok)
    stream = TextStream(decode, stops)
    pieces: list[str] = []
    stopped_at = None
    for n, i in enumerate(ids):
        pieces.append(stream.push(i))
        if stream.stopped and stopped_at is None:
            stopped_at = n
    pieces.append(stream.finish())
    want, stop = expected_cut(text, stops)
    assert "".join(pieces) == stream.text == want
    assert stream.stop_string == stop
    assert all("\ufffd" not in p for p in pieces)
    if stop is not None:
        # Set on the token whose decode (less a cut character) first reaches the stop's end.
        end = len(want) + len(stop)
        first = next(
            n for n in range(len(ids)) if len(decode(ids[: n + 1]).rstrip("\ufffd")) >= end
        )
        assert stopped_at == first
        assert pieces[first + 1 :] == [""] * (len(ids) - first)


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def char_decode(ids: Sequence[int]) -> str:
    return "".join(map(chr, ids))


def test_a_stop_string_across_tokens_stops_on_the_token_that_completes_it() -> None:
    stream = TextStream(char_decode, ["User:"])
    pieces = [stream.push(i) for i in chars("Hi.\nUser: more")]
    assert pieces[:4] == ["H", "i", ".", "\n"]
    assert pieces[4:8] == ["", "", "", ""]  # "User" might become "User:"
    assert pieces[8] == "" and stream.stopped and stream.stop_string == "User:"
    assert pieces[9:] == [""] * 5  # ids after the stop are ignored
    assert stream.finish() == ""
    assert stream.text == "Hi.\n"


def test_a_stop_string_prefix_that_diverges_is_released() -> None:
    stream = TextStream(char_decode, ["STOP!"])
    pieces = [stream.push(i) for i in chars("STOP?ok")]
    assert pieces == ["", "", "", "", "STOP?", "o", "k"]
    assert not stream.stopped and stream.stop_string is None
    assert stream.finish() == ""


def test_a_diverging_prefix_may_hide_another_start() -> None:
    # "aab" with stop "ab": after "aa" the first "a" is safe, the second is held; "b" stops.
    stream = TextStream(char_decode, ["ab"])
    assert [stream.push(i) for i in chars("aab")] == ["", "a", ""]
    assert stream.stopped and stream.text == "a"


def test_a_held_prefix_is_released_by_finish() -> None:
    stream = TextStream(char_decode, ["</answer>"])
    assert "".join(stream.push(i) for i in chars("42 </ans")) == "42 "
    assert stream.finish() == "</ans"
    assert stream.text == "42 </ans" and not stream.stopped


def test_the_stop_string_ending_first_wins_then_the_longest() -> None:
    stream = TextStream(char_decode, ["abcd", "bc"])
    run(stream, chars("xabcd"))
    assert (stream.text, stream.stop_string) == ("xa", "bc")
    # Both end at "c": cut before the longer.
    stream = TextStream(char_decode, ["bc", "abc"])
    run(stream, chars("xabcd"))
    assert (stream.text, stream.stop_string) == ("x", "abc")


def test_one_token_holding_text_the_stop_and_more() -> None:
    stream = TextStream(
        lambda ids: "".join(["ans", "wer\n\nQ: next", "more"][i] for i in ids), ["\n\n"]
    )
    assert stream.push(0) == "ans"
    assert stream.push(1) == "wer" and stream.stop_string == "\n\n"
    assert stream.push(2) == "" and stream.finish() == ""
    assert stream.text == "answer"


def test_a_stop_string_completed_by_finish() -> None:
    # The last token ends in a cut character: finish releases it, and the stop still applies.
    stream = TextStream(utf8_decode, ["k\ufffd"])
    assert "".join(stream.push(b) for b in b"ok\xf0") == "o"
    assert stream.finish() == ""
    assert stream.stopped and stream.text == "o"


def test_no_or_empty_stop_strings_stop_nothing() -> None:
    for stops in ([], [""]):
        stream = TextStream(char_decode, stops)
        assert run(stream, chars("any text")) == [*"any text", ""]
        assert not stream.stopped


def test_push_after_finish_is_a_bug() -> None:
    stream = TextStream(char_decode)
    stream.finish()
    with pytest.raises(RuntimeError):
        stream.push(ord("a"))


# --- SmolLM2's tokenizer (slow: the GGUF is read, or downloaded the first time) --------------


@pytest.mark.slow
def test_smollm2_tokenizer() -> None:
    from tiermesh.convert import smollm2
    from tiermesh.convert.gguf_tokenizer import tokenizer_json_from_gguf

    tok = Tokenizer.from_str(tokenizer_json_from_gguf(smollm2.gguf_file(progress=False)))
    text = (
        "Sure! Here is 你好世界 with emoji 😀👍🏽 🇫🇷 👩‍💻, e\u0301, and code:\n"
        "  def f(x):\n      return x ** 2\n\nUser: thanks"
    )
    ids = [*tok.encode(text, add_special_tokens=False).ids, special_id(tok, "<|im_end|>")]
    stream = for_tokenizer(tok)
    pieces = run(stream, ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)

    stream = for_tokenizer(tok, ["\n\nUser:", "never"])
    pieces = run(stream, ids)
    assert stream.text == text[: text.index("\n\nUser:")]
    assert stream.stop_string == "\n\nUser:"
