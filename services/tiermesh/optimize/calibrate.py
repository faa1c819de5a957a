"""Calibration input for static quantization: texts tokenized in fixed-size batches."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from tiermesh.core.text import TextEncoder


class TextCalibrationReader(CalibrationDataReader):
    """Feeds `input_ids` / `attention_mask` batches of `texts` (each batch padded to its
    longest text, as the router does) to onnxruntime's calibrators. Texts are tokenized up
    front; `rewind()` starts again from the first batch, so one reader can serve several
    passes."""

    def __init__(self, encoder: TextEncoder, texts: Sequence[str], batch_size: int = 8) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if not texts:
            raise ValueError("calibration needs at least one text")
        self._batches: list[dict[str, np.ndarray]] = []
        for start in range(0, len(texts), batch_size):
            enc = encoder.encode(texts[start : start + batch_size])
            self._batches.append({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask})
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self._batches):
            return None
        batch = self._batches[self._next]
        self._next += 1
        return batch

    def rewind(self) -> None:
        self._next = 0

    def __len__(self) -> int:
        return len(self._batches)
