"""Input processing of a generative model: the prompt as one user message (or the caller's
conversation) through the model's chat template, or the prompt as it is (a completion),
tokenized, and checked against the context length."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from tiermesh.core.jobs import GenerationRequest
from tiermesh.core.model_config import GenerationSpec
from tiermesh.core.tensors import TensorData, from_numpy
from tiermesh.generate.chat_file import ChatFile
from tiermesh.generate.inputs import check_prompt_length

PROMPT_IDS = "input_ids"


class PromptEncoder:
    """Built once per generative model at router start; `encode` is called per request.
    Raises GenerationInputError (the caller's INVALID_ARGUMENT) for a prompt that does not
    fit the context with the answer it asks for."""

    def __init__(self, folder: Path, spec: GenerationSpec) -> None:
        self._tokenizer = Tokenizer.from_file(str(folder / spec.tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._template = ChatFile.read(folder / spec.chat_file).template
        self.context_length = spec.context_length

    def encode(self, prompt: str, generation: GenerationRequest) -> TensorData:
        if generation.raw_prompt:
            text = prompt
        elif generation.messages:
            text = self._template.render(
                [{"role": r, "content": c} for r, c in generation.messages]
            )
        else:
            text = self._template.render([{"role": "user", "content": prompt}])
        ids = self._tokenizer.encode(text).ids
        check_prompt_length(len(ids), generation.max_new_tokens, self.context_length)
        return from_numpy(PROMPT_IDS, np.asarray([ids], dtype=np.int64), "INT64")
