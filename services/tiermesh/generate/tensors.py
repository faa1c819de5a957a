"""The tensors a generative model's requests and answers travel as: the prompt in
`text_input` (one UTF-8 string), the answer or a piece of it in `text_output`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tiermesh.core.tensors import BYTES, TensorData, from_numpy, to_numpy

PROMPT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"


def prompt_of(inputs: Sequence[TensorData]) -> str:
    """The prompt text of a validated request (text_input, one element)."""
    prompt = next(t for t in inputs if t.name == PROMPT_INPUT)
    return str(to_numpy(prompt).reshape(-1)[0])


def text_tensor(text: str) -> TensorData:
    return from_numpy(TEXT_OUTPUT, np.array([text], dtype=object), BYTES)


def output_text(outputs: Sequence[TensorData]) -> str:
    """The text of an answer or a piece ("" when there is none)."""
    out = next((t for t in outputs if t.name == TEXT_OUTPUT), None)
    return "" if out is None else str(to_numpy(out).reshape(-1)[0])
