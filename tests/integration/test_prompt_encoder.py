"""The router's input processing for SmolLM2 (fetched into models/ by `make models`): the
prompt as a user message through the chat template, tokenized, checked against the context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tiermesh.core.repository import parse_config
from tiermesh.core.tensors import to_numpy
from tiermesh.generate.inputs import GenerationInputError
from tiermesh.router.prompt import PromptEncoder

pytestmark = pytest.mark.integration

FOLDER = Path(__file__).resolve().parents[2] / "models" / "smollm2"


@pytest.fixture(scope="module")
def encoder() -> PromptEncoder:
    cfg = parse_config(yaml.safe_load((FOLDER / "config.yaml").read_text()), "smollm2")
    assert cfg.generation is not None
    return PromptEncoder(FOLDER / "1", cfg.generation)


def test_prompt_is_templated_and_tokenized(encoder: PromptEncoder) -> None:
    ids = to_numpy(encoder.encode("What is the capital of France?", 16))
    assert ids.dtype == np.int64 and ids.shape[0] == 1
    tokens = [int(i) for i in ids[0]]
    # <|im_start|>system ... <|im_end|> <|im_start|>user ... <|im_end|> <|im_start|>assistant
    assert tokens[0] == 1 and tokens.count(1) == 3 and tokens.count(2) == 2
    # "<|im_start|>", "ass", "istant", "\n": the answer starts next
    assert tokens[-4:] == [1, 520, 9531, 198]


def test_context_length_is_checked(encoder: PromptEncoder) -> None:
    with pytest.raises(GenerationInputError, match="over the model's context length of 2048"):
        encoder.encode("word " * 2100, 1)
    with pytest.raises(GenerationInputError, match="exceeds the context length of 2048"):
        encoder.encode("word " * 1900, 300)
    assert to_numpy(encoder.encode("word " * 1900, 1)).shape[1] < 2048
