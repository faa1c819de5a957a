"""Text input processing: UTF-8 strings in, token ids and attention mask out.

WordPiece with lower-casing as the model's tokenizer.json defines it, via the `tokenizers`
library; sequences longer than the model's max length are truncated and the caller is told.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tokenizers import Encoding, Tokenizer

from tiermesh.core.model_config import TOKEN_IDS, TOKEN_MASK
from tiermesh.core.tensors import (
    BYTES,
    TensorData,
    from_numpy,
    strings,
    to_numpy,
)

PAD_ID = 0
# From this many texts `encode_batch` spreads them over the tokenizer's thread pool; fewer
# are encoded one after the other: waking the pool cost ~23 us of CPU a text in batches of
# 3 (89 against 66 us, MiniLM's tokenizer on the 2-core reference machine), what the
# router's batches hold under load.
PARALLEL_FROM = 8


@dataclass(frozen=True, slots=True)
class Encoded:
    input_ids: npt.NDArray[np.int64]  # [N, L], L = longest in the request
    attention_mask: npt.NDArray[np.int64]
    truncated: bool


class TextEncoder:
    """Built once per text model at router start; `encode` is called per request."""

    def __init__(self, tokenizer_file: Path, max_length: int) -> None:
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length)
        self.max_length = max_length

    def encode(self, texts: Sequence[str]) -> Encoded:
        return _padded(self._tokenizer.encode_batch(list(texts)))

    def encode_many(
        self, texts: Sequence[TensorData]
    ) -> list[tuple[tuple[TensorData, TensorData], bool]]:
        """`encode_tensor` of many requests: one `encode_batch` call from PARALLEL_FROM
        texts (the tokenizer runs without the GIL, over all of them at once), one `encode`
        after the other below; each request is padded to its own longest text, as
        `encode_tensor` pads it."""
        per_request = [strings_of(t) for t in texts]
        flat = [s for texts_of_one in per_request for s in texts_of_one]
        if len(flat) >= PARALLEL_FROM:
            encodings = self._tokenizer.encode_batch(flat)
        else:
            encodings = [self._tokenizer.encode(s) for s in flat]
        out = []
        at = 0
        for texts_of_one in per_request:
            mine = encodings[at : at + len(texts_of_one)]
            at += len(texts_of_one)
            if len(mine) == 1:  # the common case: one text per request, no padding
                row = np.asarray([mine[0].ids], dtype=np.int64)
                tensors = (
                    TensorData(TOKEN_IDS, "INT64", row.shape, row.tobytes()),
                    TensorData(TOKEN_MASK, "INT64", row.shape, _ones(row.shape[1])),
                )
                out.append((tensors, bool(mine[0].overflowing)))
                continue
            enc = _padded(mine)
            tensors = (
                from_numpy(TOKEN_IDS, enc.input_ids, "INT64"),
                from_numpy(TOKEN_MASK, enc.attention_mask, "INT64"),
            )
            out.append((tensors, enc.truncated))
        return out

    def encode_tensor(self, text: TensorData) -> tuple[tuple[TensorData, TensorData], bool]:
        """(input_ids, attention_mask) for a BYTES tensor [N, 1] (or [N]) of strings."""
        return self.encode_many([text])[0]


def _padded(encodings: Sequence[Encoding]) -> Encoded:
    """Token ids and mask, padded to the longest of `encodings`."""
    longest = max((len(e.ids) for e in encodings), default=0)
    ids = np.full((len(encodings), longest), PAD_ID, dtype=np.int64)
    mask = np.zeros((len(encodings), longest), dtype=np.int64)
    for i, e in enumerate(encodings):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
    return Encoded(ids, mask, truncated=any(e.overflowing for e in encodings))


def strings_of(text: TensorData) -> list[str]:
    """The strings of a text tensor (UTF-8 checked by the gateway), in row-major order."""
    if text.datatype == BYTES:
        return strings(text)
    return [str(s) for s in to_numpy(text).reshape(-1)]


_ONES: dict[int, bytes] = {}


def _ones(n: int) -> bytes:
    """An attention mask of n ones as INT64 bytes (cached by length)."""
    found = _ONES.get(n)
    if found is None:
        found = _ONES[n] = np.ones(n, dtype=np.int64).tobytes()
    return found
