"""`chat.json` beside a generative model's weights: the chat template with the token strings
it refers to, the end-of-generation ids and the trained context length. Written when the
model's files are prepared (`tiermesh models fetch`, built from a GGUF's metadata by
`tiermesh.convert.gguf_tokenizer`); read by the router (the template) and the worker (the
stop tokens), which need neither the GGUF nor transformers to use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own `tojson` escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    # The template comes from the model file: untrusted code, hence the immutable sandbox.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string(template)


@dataclass(frozen=True)
class ChatTemplate:
    """A model's chat template with the token strings it refers to; rendered the way
    transformers' `apply_chat_template(..., tokenize=False)` renders it."""

    template: str
    bos_token: str | None
    eos_token: str | None
    eos_token_id: int | None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for `messages` (`role`/`content` dicts); with
        `add_generation_prompt`, ending where the assistant's reply starts."""
        return _compile(self.template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "eos_token_id": self.eos_token_id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatTemplate:
        eos_token_id = data.get("eos_token_id")
        return cls(
            template=str(data["template"]),
            bos_token=data.get("bos_token"),
            eos_token=data.get("eos_token"),
            eos_token_id=None if eos_token_id is None else int(eos_token_id),
        )


@dataclass(frozen=True)
class ChatFile:
    """`chat.json` beside a generative model's weights (written by `tiermesh models fetch`,
    read by the router for the template and by the worker for the stop tokens): the chat
    template, the end-of-generation ids and the trained context length."""

    template: ChatTemplate
    stop_token_ids: tuple[int, ...]
    context_length: int

    def to_bytes(self) -> bytes:
        """JSON with sorted keys, so equal files give equal bytes (their sha256 is in the
        model's config)."""
        record = {
            "chat_template": self.template.to_dict(),
            "stop_token_ids": list(self.stop_token_ids),
            "context_length": self.context_length,
        }
        text = json.dumps(record, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
        return text.encode("utf-8")

    @classmethod
    def read(cls, path: Path) -> ChatFile:
        record = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            ChatTemplate.from_dict(record["chat_template"]),
            tuple(int(i) for i in record["stop_token_ids"]),
            int(record["context_length"]),
        )
