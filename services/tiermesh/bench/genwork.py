"""The generate scenario's plan and its seeded requests: prompts, answer lengths, sampling.

Each request takes the next prompt of a seeded shuffle (every prompt once per pass), a
`max_new_tokens` drawn from a class of the length mix (exact shares per block of requests,
as the other scenarios' length classes), and the plan's sampling parameters. The record's
length label is the class (`16-48`), so the report groups answers by the length asked for.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tiermesh.bench.prompts import BUILTIN, BUILTIN_PROMPTS
from tiermesh.bench.workload import (
    InputSpec,
    RequestSpec,
    WorkloadTensor,
    labels,
    parse_shares,
    request_shape,
)

# Answer lengths (max_new_tokens) when the command line gives none: mostly short answers,
# some paragraphs, a few long ones.
DEFAULT_MAX_NEW_TOKENS = (("16-48", 0.5), ("48-128", 0.35), ("128-256", 0.15))
# Warm-up requests only open the channel and warm the model: short answers are enough.
WARMUP_MAX_NEW_TOKENS = 8
MAX_SEED = 2**31 - 1


def span(label: str) -> tuple[int, int]:
    """`"64"` -> (64, 64), `"16-48"` -> (16, 48); ValueError unless 1 <= lo <= hi."""
    lo, sep, hi = label.strip().partition("-")
    try:
        bounds = (int(lo), int(hi) if sep else int(lo))
    except ValueError:
        raise ValueError(f"expected N or MIN-MAX tokens, got {label.strip()!r}") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise ValueError(f"need 1 <= MIN <= MAX tokens, got {label.strip()!r}")
    return bounds


def parse_max_new_tokens(text: str) -> tuple[tuple[str, float], ...]:
    """`"128"`, `"16-64"` or a mix `"16-64=0.7,256=0.3"` (an item without a share weighs 1)
    -> ((label, share), ...) with shares summing to 1. ValueError on a bad item."""
    items = []
    for item in text.split(","):
        tokens, sep, share = item.strip().partition("=")
        lo, hi = span(tokens)
        label = str(lo) if lo == hi else f"{lo}-{hi}"
        items.append(f"{label}={share if sep else 1}")
    return parse_shares(",".join(items))


def parse_stop(text: str) -> str:
    """`--stop`: one string, or a JSON list of strings; returned as sent (the contract's
    `stop` parameter is a string either way). ValueError on a malformed list."""
    if not text:
        raise ValueError("--stop: empty")
    if not text.lstrip().startswith("["):
        return text
    try:
        items = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError(f"--stop: starts like a JSON list but is not one: {text!r}") from None
    if not items or not all(isinstance(s, str) and s for s in items):
        raise ValueError(f"--stop: expected a JSON list of non-empty strings, got {text!r}")
    return text


@dataclass(frozen=True)
class GenerationPlan:
    """The generate scenario: prompts, answer lengths, sampling, streaming or not, and
    closed loop (`rate_rps` 0: the run's `--concurrency`) or open-loop arrivals."""

    prompts: tuple[str, ...] = BUILTIN_PROMPTS
    prompts_source: str = BUILTIN
    max_new_tokens: tuple[tuple[str, float], ...] = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    stop: str = ""
    stream: bool = True
    rate_rps: float = 0.0
    poisson: bool = True

    def __post_init__(self) -> None:
        if not self.prompts or not all(p.strip() for p in self.prompts):
            raise ValueError("--prompts: every prompt must be non-empty")
        if not self.max_new_tokens:
            raise ValueError("--max-new-tokens: no answer length given")
        for label, _ in self.max_new_tokens:
            span(label)
        if not 0.0 <= self.temperature < math.inf:
            raise ValueError(f"--temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.rate_rps < math.inf:
            raise ValueError(f"--rate must be a finite number >= 0, got {self.rate_rps}")
        if self.stop:
            parse_stop(self.stop)

    @property
    def open_loop(self) -> bool:
        return self.rate_rps > 0


class GenWorkload:
    """An endless, seeded sequence of generation requests for a model whose prompt input is
    `prompt_input`. `cap` bounds every max_new_tokens (the warm-up's short answers).
    Classes, priorities, prompts and lengths, and sampling seeds come from independent
    streams of one seed."""

    text = True  # as Workload.text: the report treats the run as a text model's

    def __init__(
        self,
        prompt_input: InputSpec,
        plan: GenerationPlan,
        seed: int,
        priorities: Sequence[tuple[int, float]] = ((0, 1.0),),
        cap: int | None = None,
    ) -> None:
        self.plan = plan
        self._input = prompt_input
        self._cap = cap
        self._spans = {label: span(label) for label, _ in plan.max_new_tokens}
        class_rng, priority_rng, self._content, self._seeds = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
        )
        self._classes = labels(plan.max_new_tokens, class_rng)
        self._priorities = labels(priorities, priority_rng)
        self._prompts = self._prompt_order()
        self._index = 0

    def _prompt_order(self) -> Iterator[str]:
        while True:
            for i in self._content.permutation(len(self.plan.prompts)):
                yield self.plan.prompts[int(i)]

    def __iter__(self) -> Iterator[RequestSpec]:
        return self

    def __next__(self) -> RequestSpec:
        label = next(self._classes)
        priority = next(self._priorities)
        lo, hi = self._spans[label]
        tokens = int(self._content.integers(lo, hi + 1))
        if self._cap is not None:
            tokens = min(tokens, self._cap)
        shape = request_shape(self._input)
        prompt = next(self._prompts).encode()
        array = np.array([prompt] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
        parameters: dict[str, str | int | float | bool] = {
            "max_new_tokens": tokens,
            "temperature": self.plan.temperature,
            "top_p": self.plan.top_p,
            "seed": int(self._seeds.integers(0, MAX_SEED)),
        }
        if self.plan.stop:
            parameters["stop"] = self.plan.stop
        spec = RequestSpec(
            self._index,
            label,
            priority,
            (WorkloadTensor(self._input.name, self._input.datatype, array),),
            parameters,
        )
        self._index += 1
        return spec
