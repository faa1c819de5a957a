"""The router's tokenizers: a text encoder per tokenized model, a prompt encoder per
generative one, loaded from the model repository's checked files."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import structlog

from tiermesh.core.control_watch import ControlState
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.text import TextEncoder
from tiermesh.router.prompt import PromptEncoder

log = structlog.get_logger("tiermesh.router")


def add_encoders(
    repo: ModelRepository,
    encoders: dict[str, TextEncoder],
    prompts: dict[str, PromptEncoder],
    strict: bool = False,
) -> None:
    """A text encoder for every tokenized model of the repository that has none yet, and a
    prompt encoder for every generative one. A tokenizer whose files do not check stops the
    start (`strict`); later (a model added to the folder) it is left out and logged."""
    for name, cfg in repo.configs.items():
        # Only the files read here are checked (the weights beside them are the worker's).
        if name in encoders or name in prompts:
            continue
        if cfg.generation is not None:
            reads = [cfg.generation.tokenizer_file, cfg.generation.chat_file]
        elif cfg.tokenize is not None:
            reads = [cfg.tokenize.tokenizer_file]
        else:
            continue
        try:
            folder = repo.checked_files(name, reads)
        except RepositoryError as exc:
            if strict:
                raise
            log.error("tokenizer not loaded: files do not check", model=name, problem=str(exc))
            continue
        if cfg.generation is not None:
            prompts[name] = PromptEncoder(folder, cfg.generation)
        elif cfg.tokenize is not None:
            encoders[name] = TextEncoder(
                folder / cfg.tokenize.tokenizer_file, cfg.tokenize.max_length
            )


@dataclass
class Encoders:
    """The router's tokenizers by model name, loaded at start (a tokenizer whose files do
    not check stops it) and again whenever model control re-read the repository (a model
    added to the folder: logged and left out where its files do not check)."""

    repo: ModelRepository
    text: dict[str, TextEncoder] = field(default_factory=dict)
    prompts: dict[str, PromptEncoder] = field(default_factory=dict)

    def __post_init__(self) -> None:
        add_encoders(self.repo, self.text, self.prompts, strict=True)

    async def on_control_change(self, _: ControlState) -> None:
        await asyncio.to_thread(add_encoders, self.repo, self.text, self.prompts)
