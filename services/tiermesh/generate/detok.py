"""Generated token ids, one at a time, to the text pieces a client may be shown, and the stop
strings that end a request: pure, no I/O.

Two things make a piece premature. A token may end inside a multi-byte UTF-8 character
(byte-level BPE splits emoji and CJK across tokens), so a decode ends in U+FFFD that the next
token turns into the real character: trailing U+FFFD is held back. And a suffix of the text
may be the start of a stop string, which the next token may complete: that suffix is held
back until it diverges. A stop string and everything after it are never shown (the OpenAI and
vLLM convention).

Decoding every id each step costs O(n) a token. As vLLM and HF's TextIteratorStreamer do, we
decode a short window from `prefix_offset` and take what lies beyond the decode of
ids[prefix_offset:read_offset]; decoding from a prefix, not from read_offset, matters for
decoders whose output for a slice differs at its start (a leading space dropped). The window
moves only to a point where the decode was whole, so a character never straddles its start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"


class TextStream:
    """One request's output text, fed one generated id at a time.

    `stop` strings end the text at the first point where it contains one: the output is the
    text before that occurrence (when several end at that point, before the longest). Empty
    stop strings are ignored.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stops = tuple(dict.fromkeys(s for s in stop if s))
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._prefix_len = 0  # len(decode(ids[prefix_offset:read_offset]))
        self._taken = 0  # chars of the window past the prefix already moved to _pending
        self._pending = ""  # decoded for good, not yet emitted (may start a stop string)
        self._pieces: list[str] = []
        self._stop_string: str | None = None
        self._finished = False

    @property
    def stopped(self) -> bool:
        """True once the text contains a stop string; nothing more is emitted after that."""
        return self._stop_string is not None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the text, or None."""
        return self._stop_string

    @property
    def text(self) -> str:
        """Everything emitted so far (the final text once `finish` has been called)."""
        return "".join(self._pieces)

    def push(self, token_id: int) -> str:
        """Called with each generated id in order; returns the text that may be shown now,
        possibly "". What it returns never changes later and never holds a stop string. Ids
        pushed after the text stopped are ignored (a batch may yield one more)."""
        if self._finished:
            raise RuntimeError("push after finish")
        if self.stopped:
            return ""
        self._ids.append(token_id)
        window = self._decode(self._ids[self._prefix_offset :])
        stable = len(window.rstrip(REPLACEMENT))
        start = self._prefix_len + self._taken
        if stable > start:
            self._pending += window[start:stable]
            self._taken = stable - self._prefix_len
        if stable == len(window) and len(window) > self._prefix_len:
            # Whole: the next window starts here, so no character straddles its start.
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            self._prefix_len = len(self._decode(self._ids[self._prefix_offset :]))
            self._taken = 0
        return self._emit(final=False)

    def finish(self) -> str:
        """Called once when generation ends; returns the held-back rest (a trailing U+FFFD that
        no token completed, a would-be stop string that never was), cut at a stop string."""
        if self._finished:
            return ""
        self._finished = True
        if self.stopped:
            return ""
        window = self._decode(self._ids[self._prefix_offset :])
        self._pending += window[self._prefix_len + self._taken :]
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        """Moves what can no longer change from `_pending` to the output and returns it."""
        pending = self._pending
        cut = self._find_stop(pending)
        if cut is not None:
            piece = pending[:cut]
            self._pending = ""
        else:
            keep = 0 if final else self._stop_prefix_len(pending)
            piece = pending[: len(pending) - keep]
            self._pending = pending[len(pending) - keep :]
        if piece:
            self._pieces.append(piece)
        return piece

    def _find_stop(self, pending: str) -> int | None:
        """Where the earliest-ending stop string starts in `pending`; sets `_stop_string`.

        Only `pending` is searched: emitted text never holds the start of a stop string that
        could still complete, because any suffix that could was held back."""
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for s in self._stops:
            at = pending.find(s)
            if at >= 0:
                candidate = (at + len(s), at, s)
                if best is None or candidate < best:
                    best = candidate
        if best is None:
            return None
        self._stop_string = best[2]
        return best[1]

    def _stop_prefix_len(self, pending: str) -> int:
        """The length of the longest suffix of `pending` that some stop string starts with."""
        longest = max((len(s) for s in self._stops), default=0)
        for k in range(min(len(pending), longest - 1), 0, -1):
            tail = pending[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0


def for_tokenizer(tokenizer: Tokenizer, stop: Sequence[str] = ()) -> TextStream:
    """A TextStream over `tokenizer`'s decode, special tokens (<|im_end|>) left out."""

    def decode(ids: Sequence[int]) -> str:
        return tokenizer.decode(list(ids), skip_special_tokens=True)

    return TextStream(decode, stop)
