"""The Go front door's adaptive limits (frontdoor/go/limit.go) against the gateway's
(gateway/adaptive_limit.py): one random script of acquires, releases (with waits short and
long, and without one), limit reads and idle stretches over several classes and many
intervals, through both; every answer the same. And the door's own `forget`: a slot taken
for a call it then passed on comes back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.go_toolchain import needs_go
from tiermesh.gateway.adaptive_limit import INITIAL, INTERVAL_NS, AdaptiveLimits, LimitKey, is_late

pytestmark = [
    pytest.mark.slow,
    needs_go,
]

MAXIMUM, TARGET_MS, FALLBACK_MS = 300, 7.5, 100


@pytest.fixture(scope="module")
def door(door_binary: Path) -> Path:
    return door_binary


def go_answers(door: Path, events: list[dict[str, object]]) -> list[int]:
    """`frontdoor limits` over the events: one answer each."""
    env = {
        **os.environ,
        "TIERMESH_MAX_IN_FLIGHT": str(MAXIMUM),
        "TIERMESH_TARGET_WAIT_MS": str(TARGET_MS),
        "TIERMESH_RETRY_AFTER_MS": str(FALLBACK_MS),
    }
    done = subprocess.run(
        [str(door), "limits"],
        input="\n".join(json.dumps(e) for e in events) + "\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    return [int(line) for line in done.stdout.split()]


def script(rng: np.random.Generator, n: int) -> list[dict[str, object]]:
    """Events on a clock that moves 0-30 ms at a time; each class alternates floods (long
    waits) and calm (short ones), so limits shrink, grow and hit both bounds."""
    classes = [("mlp", 1), ("mlp", 2), ("minilm-l6", 2)]
    held: dict[LimitKey, int] = dict.fromkeys(classes, 0)
    events: list[dict[str, object]] = []
    now = 0
    for _ in range(n):
        now += int(rng.integers(0, 30_000_000 // 40))
        model, priority = classes[int(rng.integers(len(classes)))]
        if rng.random() < 0.001:  # the class drains and stays idle past an interval
            for _ in range(held[(model, priority)]):
                events.append(
                    {"op": "release", "model": model, "priority": priority, "now_ns": now}
                    | {"wait_ns": 1_000_000, "expired": False, "budget_ns": 0}
                )
            held[(model, priority)] = 0
            now += int(rng.integers(2 * INTERVAL_NS, 5 * INTERVAL_NS))
        base = {"model": model, "priority": priority, "now_ns": now}
        flood = (now // (20 * INTERVAL_NS)) % 2 == 1
        roll = rng.random()
        if roll < 0.55:
            # A deadline budget or none: the drain cap binds some of the acquires.
            budget = 0 if rng.random() < 0.3 else int(rng.exponential(300e6))
            events.append({"op": "acquire", **base, "budget_ns": budget})
            held[(model, priority)] += 1  # a refused one is released too: harmless
        elif roll < 0.95 and held[(model, priority)] > 0:
            held[(model, priority)] -= 1
            roll = rng.random()
            expired = False
            if roll < 0.15:
                wait = None
            elif roll < 0.17:  # expired unanswered: all its time
                wait, expired = 1_000_000_000, True
            else:
                wait = int(rng.exponential(2e6)) + (40_000_000 if flood else 0)
            budget = 0 if rng.random() < 0.3 else int(rng.exponential(100e6))
            events.append(
                {"op": "release", **base, "wait_ns": wait, "expired": expired, "budget_ns": budget}
            )
        else:
            budget = 0 if rng.random() < 0.5 else int(rng.exponential(300e6))
            events.append({"op": "limit", **base, "budget_ns": budget})
    return events


def python_answers(events: list[dict[str, object]]) -> tuple[list[int], int]:
    """The gateway's answers, and how many acquires met a drain cap below the limit."""
    lim = AdaptiveLimits(maximum=MAXIMUM, target_wait_ms=TARGET_MS, fallback_retry_ms=FALLBACK_MS)
    out = []
    capped = 0
    for e in events:
        key = (str(e["model"]), int(e["priority"]))  # type: ignore[call-overload]
        now = int(e["now_ns"])  # type: ignore[call-overload]
        if e["op"] == "acquire":
            budget = int(e["budget_ns"])  # type: ignore[call-overload]
            answer = lim.acquire(key, now, budget)
            capped += lim.limit(key, budget) < lim.limit(key)
            out.append(answer)
        elif e["op"] == "release":
            wait = e["wait_ns"]
            wait_ns = None if wait is None else int(wait)  # type: ignore[call-overload]
            budget = int(e["budget_ns"])  # type: ignore[call-overload]
            lim.release(key, now, wait_ns, is_late(wait_ns, budget, bool(e["expired"])))
            out.append(0)
        else:
            out.append(lim.limit(key, int(e["budget_ns"])))  # type: ignore[call-overload]
    return out, capped


def test_the_door_limits_as_the_gateway_does(door: Path) -> None:
    events = script(np.random.default_rng(23), 40_000)
    expected, capped = python_answers(events)
    assert capped > 100, capped  # the drain cap decides some of them
    # The script reaches every state: refusals with and without a measured rate, limits
    # at the minimum, below and above the initial one.
    assert sum(1 for a, e in zip(expected, events, strict=True) if e["op"] == "acquire" and a)
    limits = {a for a, e in zip(expected, events, strict=True) if e["op"] == "limit"}
    assert min(limits) <= 8 and max(limits) > 256, sorted(limits)
    got = go_answers(door, events)
    assert len(got) == len(expected)
    first = next((i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b), None)
    assert first is None, (
        first,
        events[max(0, first - 3) : first + 1],
        got[first],
        expected[first],
    )


def test_a_forgotten_slot_comes_back_and_is_no_end(door: Path) -> None:
    """The door admits a call from its head, then may find its body is not one it takes
    and pass it on: the slot comes back, and no end is counted (no drain rate is learnt)."""
    base = {"model": "mlp", "priority": 1, "now_ns": 0}
    events = [
        *[{"op": "acquire", **base}] * INITIAL,
        {"op": "acquire", **base},  # full: refused, the fallback retry (no rate yet)
        {"op": "forget", **base},
        {"op": "acquire", **base},  # the forgotten slot
        {"op": "acquire", **base},  # full again
        *[{"op": "forget", **base}] * (INITIAL + 5),  # more than held: never below zero
        {"op": "limit", **base, "now_ns": INTERVAL_NS},  # an interval on: nothing measured
        *[{"op": "acquire", **base, "now_ns": INTERVAL_NS}] * INITIAL,
        {"op": "acquire", **base, "now_ns": INTERVAL_NS},
    ]
    got = go_answers(door, events)
    assert got[:INITIAL] == [0] * INITIAL
    assert got[INITIAL : INITIAL + 4] == [FALLBACK_MS, 0, 0, FALLBACK_MS]
    assert got[-(INITIAL + 2) :] == [INITIAL, *[0] * INITIAL, FALLBACK_MS]
