"""The router's input processing for SmolLM2 (fetched into models/ by `make models`): the
prompt as a user message through the chat template (or a conversation through it, or the
prompt as it is), tokenized, checked against the context."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tiermesh.core.jobs import GenerationRequest
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
    ids = to_numpy(encoder.encode("What is the capital of France?", GenerationRequest(16)))
    assert ids.dtype == np.int64 and ids.shape[0] == 1
    tokens = [int(i) for i in ids[0]]
    # <|im_start|>system ... <|im_end|> <|im_start|>user ... <|im_end|> <|im_start|>assistant
    assert tokens[0] == 1 and tokens.count(1) == 3 and tokens.count(2) == 2
    # "<|im_start|>", "ass", "istant", "\n": the answer starts next
    assert tokens[-4:] == [1, 520, 9531, 198]


def test_context_length_is_checked(encoder: PromptEncoder) -> None:
    with pytest.raises(GenerationInputError, match="over the model's context length of 2048"):
        encoder.encode("word " * 2100, GenerationRequest(1))
    with pytest.raises(GenerationInputError, match="exceeds the context length of 2048"):
        encoder.encode("word " * 1900, GenerationRequest(300))
    assert to_numpy(encoder.encode("word " * 1900, GenerationRequest(1))).shape[1] < 2048


def test_a_conversation_of_one_user_message_is_the_prompt(encoder: PromptEncoder) -> None:
    """The OpenAI chat door's messages: one user message encodes as the v2 prompt does; a
    system message replaces the template's default one; an earlier turn is in the prompt."""
    question = "What is the capital of France?"
    prompt = [int(i) for i in to_numpy(encoder.encode(question, GenerationRequest(16)))[0]]
    chat = GenerationRequest(16, messages=(("user", question),))
    assert [int(i) for i in to_numpy(encoder.encode(question, chat))[0]] == prompt
    system = GenerationRequest(16, messages=(("system", "Answer in French."), ("user", question)))
    with_system = [int(i) for i in to_numpy(encoder.encode(question, system))[0]]
    assert with_system != prompt and with_system.count(1) == 3
    turns = GenerationRequest(
        16, messages=(("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", question))
    )
    assert [int(i) for i in to_numpy(encoder.encode(question, turns))[0]].count(1) == 5


def test_a_raw_prompt_skips_the_template(encoder: PromptEncoder) -> None:
    ids = [
        int(i)
        for i in to_numpy(encoder.encode("Paris is", GenerationRequest(4, raw_prompt=True)))[0]
    ]
    assert 1 not in ids and 0 < len(ids) <= 4
