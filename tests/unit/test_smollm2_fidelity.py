"""Issue 11, acceptance 1: greedy generation through our ONNX decoder (converted from the GGUF
by tiermesh.convert.llama, prompts rendered and tokenized by tiermesh.convert.gguf_tokenizer)
equals, token for token, transformers loading the same GGUF file itself, for 20 chat prompts
and their first 32 new tokens. Neither side stops at the end-of-turn token, so all 32 are
compared even where the answer is shorter (where it ended is reported)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from tests.conftest import MODELS
from tiermesh.convert import provenance, smollm2
from tiermesh.convert.gguf_tokenizer import (
    chat_template_from_metadata,
    read_tokenizer_metadata,
    tokenizer_json,
)
from tiermesh.convert.llama import convert_gguf
from tiermesh.convert.llama_check import greedy, leading_matches
from tiermesh.worker.runner import session_options

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence what a GPU is.",
    "List three fruits that are red.",
    "How many legs does a spider have?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give me a name for a friendly robot.",
    "Why is the sky blue? Answer briefly.",
    "Write a Python function that adds two numbers.",
    "Who wrote Romeo and Juliet?",
    "Describe a cat in five words.",
    "What is the boiling point of water in Celsius?",
    "Suggest a title for a short story about winter.",
    "What does CPU stand for?",
    "Tell me a fun fact about octopuses.",
    "Summarize the plot of Cinderella in one sentence.",
    "What is the opposite of 'ancient'?",
    "Name a planet in our solar system.",
    "How do I make a cup of tea?",
)


@pytest.fixture(scope="module")
def gguf() -> Path:
    return smollm2.gguf_file(progress=False)


@pytest.fixture(scope="module")
def session(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ort.InferenceSession]:
    """Our decoder: the one `make models` converted, where its provenance says this very
    converter source made it from this package (about a minute saved); else converted here."""
    fetched = MODELS / smollm2.NAME / smollm2.MODEL_VERSION
    if provenance.up_to_date(fetched, smollm2.RECIPE.sources, smollm2.FILES):
        path = fetched / "model.onnx"
    else:
        path = tmp_path_factory.mktemp("smollm2") / "model.onnx"
        convert_gguf(gguf, path)
    yield ort.InferenceSession(str(path), session_options(2), providers=["CPUExecutionProvider"])
    if path.parent != fetched:
        path.unlink()


@pytest.fixture(scope="module")
def reference(gguf: Path) -> tuple[Any, Any]:
    torch.set_num_threads(2)
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    return tok, model


def test_greedy_generation_equals_transformers_on_the_same_gguf(
    gguf: Path, session: ort.InferenceSession, reference: tuple[Any, Any], tmp_path: Path
) -> None:
    tok, model = reference
    meta = read_tokenizer_metadata(gguf)
    ours = Tokenizer.from_str(tokenizer_json(meta))
    template = chat_template_from_metadata(meta)
    eos = model.generation_config.eos_token_id
    turn_end = set(eos if isinstance(eos, list) else [eos])
    assert turn_end == {meta.eos_token_id}
    model.generation_config.eos_token_id = None  # compare all 32 tokens, past the answer
    rows = []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        text = template.render(messages)
        assert text == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = ours.encode(text).ids
        assert ids == tok(text)["input_ids"]
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tok.eos_token_id,
            )
        expected = generated[0, len(ids) :].tolist()
        got, _ = greedy(session, np.array([ids], np.int64), NEW_TOKENS, stop=())
        answer = next((i for i, t in enumerate(got) if t in turn_end), len(got))
        rows.append(
            {
                "prompt": prompt,
                "matching": leading_matches(got, expected),
                "onnx": len(got),
                "reference": len(expected),
                "answer_tokens": answer,
                "text": ours.decode(got[:answer]),
            }
        )
    (tmp_path / "fidelity.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))  # the figures, with -s
    assert all(r["onnx"] == r["reference"] == r["matching"] == NEW_TOKENS for r in rows), rows
    assert rows[0]["text"] == "The capital of France is Paris."
