"""Issue 11's bad inputs, as the gateway will check them, and seeded sampling."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tiermesh.generate.inputs import (
    GenerationInputError,
    Sampling,
    check_prompt_length,
    parse_inputs,
)
from tiermesh.generate.sampling import choose, generator

LIMIT = 512


def test_defaults_are_greedy_and_bounded() -> None:
    got = parse_inputs("Hi", {}, LIMIT)
    assert got.max_new_tokens == 64
    assert got.sampling == Sampling(0.0, 1.0, 0)
    assert got.stop == ()
    assert parse_inputs("Hi", {}, 10).max_new_tokens == 10


@pytest.mark.parametrize(
    ("prompt", "parameters", "message"),
    [
        ("", {}, "prompt: empty"),
        ("   \n", {}, "prompt: empty"),
        ("Hi", {"max_new_tokens": 0}, "max_new_tokens: 0 is outside 1..512"),
        ("Hi", {"max_new_tokens": -3}, "max_new_tokens: -3 is outside"),
        ("Hi", {"max_new_tokens": 513}, "max_new_tokens: 513 is outside 1..512"),
        ("Hi", {"max_new_tokens": 2.5}, "max_new_tokens: expected an integer"),
        ("Hi", {"max_new_tokens": True}, "max_new_tokens: expected an integer"),
        ("Hi", {"temperature": math.nan}, "temperature: nan is not a finite number"),
        ("Hi", {"temperature": math.inf}, "temperature: inf is not a finite number"),
        ("Hi", {"temperature": -0.1}, "temperature: -0.1 is outside [0.0, 2.0]"),
        ("Hi", {"temperature": "hot"}, "temperature: expected a number"),
        ("Hi", {"top_p": 0.0}, "top_p: 0.0 is outside (0.0, 1.0]"),
        ("Hi", {"top_p": 1.5}, "top_p: 1.5 is outside"),
        ("Hi", {"seed": -1}, "seed: -1 is outside"),
        ("Hi", {"stop": ""}, "stop: each entry must be a non-empty string"),
        ("Hi", {"stop": ["a", 3]}, "stop: each entry"),
        ("Hi", {"stop": ["a"] * 5}, "stop: at most 4 strings"),
        ("Hi", {"stop": 7}, "stop: expected a string or a list of strings"),
    ],
)
def test_bad_inputs_are_refused_with_the_field_named(
    prompt: str, parameters: dict[str, object], message: str
) -> None:
    with pytest.raises(
        GenerationInputError,
        match=re.escape(message),
    ):
        parse_inputs(prompt, parameters, LIMIT)


def test_good_inputs_come_through() -> None:
    got = parse_inputs(
        "Hi",
        {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 42, "stop": "\n"},
        LIMIT,
    )
    assert (got.max_new_tokens, got.sampling, got.stop) == (8, Sampling(0.7, 0.9, 42), ("\n",))


def test_prompt_over_the_context_length() -> None:
    check_prompt_length(100, 28, 128)
    with pytest.raises(GenerationInputError, match=r"prompt: 128 tokens .* context length of 128"):
        check_prompt_length(128, 1, 128)
    with pytest.raises(GenerationInputError, match=r"max_new_tokens: 29 .* \(at most 28\)"):
        check_prompt_length(100, 29, 128)


def test_greedy_is_argmax() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0])
    assert choose(logits, Sampling(), generator(Sampling())) == 1


def test_same_seed_same_tokens_and_top_p_keeps_the_nucleus() -> None:
    rng_logits = np.random.default_rng(0).normal(size=(50, 100))
    s = Sampling(temperature=0.8, top_p=0.9, seed=7)

    def draw(sampling: Sampling) -> list[int]:
        rng = generator(sampling)
        return [choose(row, sampling, rng) for row in rng_logits]

    assert draw(s) == draw(s)
    assert draw(s) != draw(Sampling(temperature=0.8, top_p=0.9, seed=8))
    # A tiny top_p keeps only the most likely token: sampling becomes argmax.
    narrow = Sampling(temperature=1.0, top_p=1e-9, seed=3)
    rng = generator(narrow)
    assert [choose(row, narrow, rng) for row in rng_logits] == [
        int(np.argmax(row)) for row in rng_logits
    ]


def test_sampling_follows_the_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    s = Sampling(temperature=1.0, top_p=1.0, seed=1)
    rng = generator(s)
    counts = np.bincount([choose(logits, s, rng) for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)
