"""Choosing the next token from a sequence's logits: argmax at temperature 0, else top-p
(nucleus) sampling at the temperature with a generator seeded per request, so the same seed
gives the same tokens. Pure: the generator is passed in (one per sequence)."""

from __future__ import annotations

import numpy as np

from tiermesh.generate.inputs import Sampling


def generator(sampling: Sampling) -> np.random.Generator:
    """The sequence's own random stream (PCG64 seeded with the request's seed)."""
    return np.random.default_rng(sampling.seed)


def choose(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The next token from `logits` [vocab]."""
    if sampling.temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    # The smallest prefix whose mass reaches top_p (at least the most likely token).
    keep = order[: int(np.searchsorted(cumulative, sampling.top_p)) + 1]
    kept = probs[keep] / probs[keep].sum()
    return int(keep[rng.choice(len(keep), p=kept)])
