"""What a generation request may ask for, checked before anything is queued: the rules of
issue 11's bad-input acceptance, as pure functions. The gateway turns a `GenerationInputError`
into INVALID_ARGUMENT with its message, which names the field and the allowed range.

Inputs (KServe v2 request parameters beside the prompt tensor): the prompt text (the chat
template is applied to it as one user message), `max_new_tokens`, `temperature` (0 = greedy),
`top_p`, `seed` and `stop` strings.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MAX_NEW_TOKENS = 64
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64


class GenerationInputError(ValueError):
    """A request the model cannot run as asked; the message says which field and why."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: argmax when temperature is 0, else from the softmax at
    `temperature` restricted to the smallest set of tokens whose probability reaches
    `top_p`, with a generator seeded by `seed` (the same seed, the same tokens)."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class GenerationInputs:
    prompt: str
    max_new_tokens: int
    sampling: Sampling
    stop: tuple[str, ...] = ()


def parse_inputs(
    prompt: str, parameters: Mapping[str, object], max_new_tokens_limit: int
) -> GenerationInputs:
    """The request's inputs, checked; raises GenerationInputError naming the bad field."""
    if not prompt.strip():
        raise GenerationInputError("prompt: empty (or only whitespace)")
    return GenerationInputs(
        prompt=prompt,
        max_new_tokens=_max_new_tokens(parameters, max_new_tokens_limit),
        sampling=Sampling(
            temperature=_number(parameters, "temperature", 0.0, lo=0.0, hi=2.0),
            top_p=_number(parameters, "top_p", 1.0, lo=0.0, hi=1.0, open_lo=True),
            seed=_integer(parameters, "seed", 0, lo=0, hi=2**63 - 1),
        ),
        stop=_stop(parameters.get("stop")),
    )


def check_prompt_length(prompt_tokens: int, max_new_tokens: int, context_length: int) -> None:
    """The prompt, once templated and tokenized, and the answer must fit the context."""
    if prompt_tokens >= context_length:
        raise GenerationInputError(
            f"prompt: {prompt_tokens} tokens after the chat template, over the model's "
            f"context length of {context_length}"
        )
    if prompt_tokens + max_new_tokens > context_length:
        raise GenerationInputError(
            f"max_new_tokens: {max_new_tokens} after a {prompt_tokens}-token prompt exceeds "
            f"the context length of {context_length} (at most {context_length - prompt_tokens})"
        )


def _max_new_tokens(parameters: Mapping[str, object], limit: int) -> int:
    return _integer(parameters, "max_new_tokens", min(DEFAULT_MAX_NEW_TOKENS, limit), 1, limit)


def _integer(parameters: Mapping[str, object], name: str, default: int, lo: int, hi: int) -> int:
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GenerationInputError(f"{name}: expected an integer, got {value!r}")
    if not lo <= value <= hi:
        raise GenerationInputError(f"{name}: {value} is outside {lo}..{hi}")
    return value


def _number(
    parameters: Mapping[str, object],
    name: str,
    default: float,
    lo: float,
    hi: float,
    open_lo: bool = False,
) -> float:
    value = parameters.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GenerationInputError(f"{name}: expected a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise GenerationInputError(f"{name}: {value!r} is not a finite number")
    if number > hi or number < lo or (open_lo and number == lo):
        bound = f"({lo}, {hi}]" if open_lo else f"[{lo}, {hi}]"
        raise GenerationInputError(f"{name}: {number} is outside {bound}")
    return number


def _stop(value: object) -> tuple[str, ...]:
    """`stop`: one string, or a JSON-style list of strings (a KServe string parameter)."""
    if value is None:
        return ()
    items: Sequence[object] = [value] if isinstance(value, str) else value  # type: ignore[assignment]
    if not isinstance(items, list | tuple):
        raise GenerationInputError(f"stop: expected a string or a list of strings, got {value!r}")
    if len(items) > MAX_STOP_STRINGS:
        raise GenerationInputError(f"stop: at most {MAX_STOP_STRINGS} strings, got {len(items)}")
    out = []
    for item in items:
        if not isinstance(item, str) or not item or len(item) > MAX_STOP_CHARS:
            raise GenerationInputError(
                f"stop: each entry must be a non-empty string of at most {MAX_STOP_CHARS} "
                f"characters, got {item!r}"
            )
        out.append(item)
    return tuple(out)
