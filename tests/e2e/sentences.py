"""200 varied sentences: short, long, punctuation, digits, non-English, over-long."""

from __future__ import annotations

import random

_SUBJECTS = [
    "The gateway",
    "A batcher",
    "Our router",
    "Every worker",
    "The queue",
    "Redis",
    "A tiny model",
    "The tokenizer",
    "This service",
    "Edge nodes",
]
_VERBS = [
    "routes",
    "batches",
    "drops",
    "delivers",
    "measures",
    "retries",
    "encodes",
    "rejects",
    "balances",
    "streams",
]
_OBJECTS = [
    "requests to central workers",
    "short sentences first",
    "expired jobs quietly",
    "embeddings of 384 floats",
    "traces through the queue",
    "3.14159 ms of compute",
    "the 2nd of March, 2026",
    "payloads over 16 KiB",
    "tokens (and punctuation!)",
    "light work to the edge",
]
_FIXED = [
    "",
    "a",
    "Hi!",
    "?!...,;:--",
    "1234567890",
    "3 + 4 = 7, 10 / 2 = 5.0, 2^10 = 1024",
    "Ünïcödé àccents ça va très bien",
    "日本語の文章も埋め込めますか",
    "Привет, как дела?",
    "مرحبا بالعالم",
    "emoji 🚀🔥 in text 👍",
    "MIXED case WORDS and CamelCaseTokens",
    "e-mail: someone@example.com, url: https://example.org/a?b=c",
    "tabs\tand\nnewlines\r\ninside",
    "   leading and trailing spaces   ",
    "The quick brown fox jumps over the lazy dog. " * 3,
    " ".join(["An inference mesh routes light requests to edge workers."] * 30),  # > 256 tokens
    " ".join(f"word{i}" for i in range(120)),
]


def sentences(n: int = 200, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    out = list(_FIXED)
    while len(out) < n:
        parts = [
            f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)}."
            for _ in range(rng.choice([1, 1, 1, 2, 3, 6, 12]))
        ]
        out.append(" ".join(parts))
    return out[:n]
