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
from tokenizers import Tokenizer

from tiermesh.core.tensors import TensorData, from_numpy, to_numpy

PAD_ID = 0


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
        encodings = self._tokenizer.encode_batch(list(texts))
        longest = max(len(e.ids) for e in encodings)
        ids = np.full((len(encodings), longest), PAD_ID, dtype=np.int64)
        mask = np.zeros((len(encodings), longest), dtype=np.int64)
        for i, e in enumerate(encodings):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        return Encoded(ids, mask, truncated=any(e.overflowing for e in encodings))

    def encode_tensor(self, text: TensorData) -> tuple[tuple[TensorData, TensorData], bool]:
        """(input_ids, attention_mask) for a BYTES tensor [N, 1] (or [N]) of strings."""
        strings = [str(s) for s in to_numpy(text).reshape(-1)]
        enc = self.encode(strings)
        return (
            from_numpy("input_ids", enc.input_ids, "INT64"),
            from_numpy("attention_mask", enc.attention_mask, "INT64"),
        ), enc.truncated
