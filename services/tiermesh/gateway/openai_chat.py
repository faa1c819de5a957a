"""What the OpenAI door's `/v1/chat/completions` and `/v1/completions` decide, with no HTTP:
the generation request of a body, and the documents of the answer, whole or as the chunks of
a server-sent-event stream. Pure.

A chat body's messages go to the router as a conversation, which the model's chat template
renders (one user message renders as a v2 prompt does); a completion's prompt goes as it is.
The sampling fields become the generation parameters the v2 door takes (`max_tokens` or
`max_completion_tokens` is `max_new_tokens`), checked by the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiermesh.core.tensors import BYTES, from_numpy
from tiermesh.gateway.openai_schema import (
    ChatBody,
    CompletionBody,
    ParamError,
    param_error,
    unsupported,
)
from tiermesh.gateway.requests import InferRequest
from tiermesh.generate.tensors import PROMPT_INPUT

# The v2 parameter each OpenAI sampling field becomes.
_V2_NAMES = {"max_new_tokens": "max_tokens"}


@dataclass(frozen=True, slots=True)
class Headers:
    """What a call's headers ask (the OpenAI client has no field for them)."""

    client_request_id: str = ""
    priority: int = 0
    timeout_us: int | None = None


def chat_request(body: ChatBody, headers: Headers) -> InferRequest:
    """The generation request of a chat body; INVALID_ARGUMENT naming the field."""
    _check(body)
    messages = tuple(
        ("system" if m.role == "developer" else m.role, m.text()) for m in body.messages
    )
    joined = "\n".join(text for _, text in messages)
    if not joined.strip():
        raise param_error("messages", "every message is empty")
    max_tokens = body.max_completion_tokens or body.max_tokens
    return _request(body, joined, max_tokens, headers, messages=messages)


def completion_request(body: CompletionBody, headers: Headers) -> InferRequest:
    _check(body)
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise param_error("prompt", f"one prompt per request, got {len(prompts)}")
    if not prompts[0].strip():
        raise param_error("prompt", "empty (or only whitespace)")
    # OpenAI's completions default to 16 tokens.
    return _request(body, prompts[0], body.max_tokens or 16, headers, raw_prompt=True)


def _check(body: ChatBody | CompletionBody) -> None:
    if (refusal := unsupported(body)) is not None:
        raise refusal


def _request(
    body: ChatBody | CompletionBody,
    prompt: str,
    max_tokens: int | None,
    headers: Headers,
    messages: tuple[tuple[str, str], ...] = (),
    raw_prompt: bool = False,
) -> InferRequest:
    parameters: dict[str, object] = {}
    if max_tokens is not None:
        parameters["max_new_tokens"] = max_tokens
    for name in ("temperature", "top_p", "seed"):
        if (value := getattr(body, name)) is not None:
            parameters[name] = value
    if body.stop:
        parameters["stop"] = body.stops()
    text = from_numpy(PROMPT_INPUT, np.array([prompt.encode("utf-8")], dtype=object), BYTES)
    return InferRequest(
        model=body.model,
        version="",
        inputs=(text,),
        client_request_id=headers.client_request_id,
        priority=headers.priority,
        timeout_us=headers.timeout_us,
        parameters=parameters,
        messages=messages,
        raw_prompt=raw_prompt,
    )


def openai_param(err: ParamError | Exception, message: str) -> tuple[str, str]:
    """A generation refusal in OpenAI's words: the v2 name of a field (`max_new_tokens: ...`)
    becomes the OpenAI one; (param, message)."""
    if isinstance(err, ParamError):
        return err.param, message
    for v2, name in _V2_NAMES.items():
        if message.startswith(f"{v2}:"):
            return name, name + message[len(v2) :]
    field = message.split(":", 1)[0]
    return (field if field in {"temperature", "top_p", "seed", "stop"} else ""), message


@dataclass(frozen=True, slots=True)
class Completion:
    """One answer's identity: chat or text completion, its id, creation time and model."""

    chat: bool
    id: str
    created: int
    model: str

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def head(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model}

    def document(self, text: str, finish_reason: str, usage: dict[str, int]) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text
        return {**self.head(), "choices": [choice], "usage": usage, "system_fingerprint": None}

    def chunk(self, text: str | None, finish_reason: str | None = None) -> dict[str, Any]:
        """A stream's chunk: the first (chat: the role), a piece, or the last (its
        finish_reason, no text)."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            if text is None:
                choice["delta"] = {} if finish_reason else {"role": "assistant", "content": ""}
            else:
                choice["delta"] = {"content": text}
        else:
            choice["text"] = text or ""
        return {**self._chunk_head(), "choices": [choice], "system_fingerprint": None}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {**self._chunk_head(), "choices": [], "usage": usage}

    def _chunk_head(self) -> dict[str, Any]:
        """A stream chunk's: a chat's object is `chat.completion.chunk`, a completion's the
        same as its whole answer's."""
        head = self.head()
        if self.chat:
            head["object"] = "chat.completion.chunk"
        return head


def usage_of(annotations: Mapping[str, str]) -> dict[str, int]:
    """OpenAI's usage from the worker's counts of the answer."""
    prompt = int(annotations.get("prompt_tokens", 0))
    completion = int(annotations.get("generated_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def finish_reason_of(annotations: Mapping[str, str]) -> str:
    """OpenAI's two reasons: `length` (max_tokens reached), else `stop` (the model ended its
    turn, or a stop string came)."""
    return "length" if annotations.get("finish_reason") == "length" else "stop"
