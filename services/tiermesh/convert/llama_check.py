"""Greedy generation through the converted decoder, one sequence, the KV cache carried from
step to step: how the conversion is checked against an independent reference (tests and
`scripts/check_smollm2_onnx.py`). The serving loop batches sequences its own way."""

from __future__ import annotations

from collections.abc import Collection

import numpy as np
import onnxruntime as ort


def greedy(
    session: ort.InferenceSession, prompt: np.ndarray, new_tokens: int, stop: Collection[int]
) -> tuple[list[int], np.ndarray]:
    """The tokens after `prompt` (int64 [1, S]), argmax at every step, ending after a token
    in `stop` or `new_tokens` tokens; and the prefill's logits [S, vocab]."""
    past = {
        i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
        for i in session.get_inputs()
        if i.name.startswith("past_key_values.")
    }
    names = [o.name for o in session.get_outputs()]
    ids, total = prompt, prompt.shape[1]
    positions = np.arange(total, dtype=np.int64)[None, :]
    out: list[int] = []
    first: np.ndarray | None = None
    while len(out) < new_tokens:
        feeds = {
            "input_ids": ids,
            "attention_mask": np.ones((1, total), np.int64),
            "position_ids": positions,
            **past,
        }
        values = dict(zip(names, session.run(names, feeds), strict=True))
        logits = values["logits"][0]
        first = logits if first is None else first
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if token in stop:
            break
        past = {n: values[n.replace("past_key_values.", "present.")] for n in past}
        ids = np.array([[token]], np.int64)
        positions = np.array([[total]], np.int64)
        total += 1
    assert first is not None
    return out, first


def leading_matches(a: list[int], b: list[int]) -> int:
    """How many tokens two generations share from the start."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
