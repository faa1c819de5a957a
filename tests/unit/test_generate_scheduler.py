"""Continuous-batching decisions of `tiermesh.generate.scheduler`, with plain ints."""

from __future__ import annotations

import pytest

from tiermesh.generate.scheduler import (
    GenRequest,
    Leave,
    Limits,
    Reject,
    RunKind,
    SeqState,
    next_run,
    plan_step,
    prefill_chunks,
)

WIDE = Limits(max_sequences=8, max_kv_tokens=1000, prefill_chunk=100, step_tokens=1000)


def req(
    rid: str,
    prompt_len: int = 4,
    max_new: int = 4,
    priority: int = 1,
    arrived: int = 0,
    deadline: int = 0,
    stop: frozenset[int] = frozenset({99}),
) -> GenRequest:
    return GenRequest(rid, tuple(range(prompt_len)), max_new, priority, deadline, arrived, stop)


def decoding(r: GenRequest, generated: list[int] | None = None) -> SeqState:
    """A sequence whose prompt is all in the cache."""
    gen = generated if generated is not None else [1]
    return SeqState(r, list(gen), len(r.prompt), len(r.prompt) + len(gen) - 1)


def test_admission_by_priority_then_arrival() -> None:
    waiting = [
        req("late-low", priority=2, arrived=1),
        req("late-high", priority=1, arrived=5),
        req("early-high", priority=1, arrived=2),
        req("early-low", priority=2, arrived=0),
    ]
    plan = plan_step([], waiting, 10, WIDE)
    assert plan.admit == ("early-high", "late-high", "early-low", "late-low")


def test_sequence_bound() -> None:
    limits = Limits(max_sequences=3, max_kv_tokens=1000, prefill_chunk=8, step_tokens=64)
    running = [decoding(req("r0"))]
    plan = plan_step(running, [req(f"w{i}", arrived=i) for i in range(4)], 0, limits)
    assert plan.admit == ("w0", "w1")


def test_kv_token_bound_counts_prompt_plus_max_new() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=30, prefill_chunk=8, step_tokens=64)
    running = [decoding(req("r0", prompt_len=5, max_new=5))]  # reserves 10
    waiting = [req("a", 5, 5, arrived=0), req("b", 5, 5, arrived=1), req("c", 5, 5, arrived=2)]
    plan = plan_step(running, waiting, 0, limits)
    assert plan.admit == ("a", "b")  # 10 + 10 + 10 = 30, c would need 40


def test_oversized_request_rejected_others_admitted() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=20, prefill_chunk=8, step_tokens=64)
    waiting = [req("huge", 15, 6, arrived=0), req("small", 4, 4, arrived=1)]
    plan = plan_step([], waiting, 0, limits)
    assert plan.reject == (Reject("huge", "too_large"),)
    assert plan.admit == ("small",)


def test_chunked_prefill_within_the_padded_step_budget() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=1000, prefill_chunk=8, step_tokens=20)
    running = [
        decoding(req("d1")),
        decoding(req("d2")),
        SeqState(req("p-half", prompt_len=30, arrived=0), [], 24, 24),  # 6 prompt tokens left
    ]
    waiting = [req("n1", 30, arrived=1), req("n2", 30, arrived=2), req("n3", 30, arrived=3)]
    plan = plan_step(running, waiting, 0, limits, last_run="decode")
    assert plan.admit == ("n1", "n2", "n3")
    # a prefill run, the decoders wait: p-half its last 6; n1 a full chunk of 8 widens the
    # run to 8 (2 rows x 8 = 16); a third row of 8 would make 24 > 20, so n2 and n3 wait
    assert plan.run == "prefill"
    assert dict(plan.feed) == {"p-half": 6, "n1": 8}


def test_a_later_chunk_is_cut_to_the_width_so_far_to_fit() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=1000, prefill_chunk=8, step_tokens=12)
    waiting = [req("short", 3, arrived=0), req("long", 30, arrived=1), req("next", 30, arrived=2)]
    plan = plan_step([], waiting, 0, limits)
    # 1 x 3, then long's 8 would make 2 x 8 = 16 > 12: cut to 3 (2 x 3 = 6); next too (9)
    assert dict(plan.feed) == {"short": 3, "long": 3, "next": 3}
    assert len(plan.feed) * max(plan.feed.values()) <= limits.step_tokens


def test_prefill_chunks_go_by_priority() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=1000, prefill_chunk=8, step_tokens=10)
    running = [SeqState(req("low", 20, priority=3, arrived=0))]
    plan = plan_step(running, [req("high", 20, priority=1, arrived=5)], 0, limits)
    assert dict(plan.feed) == {"high": 8}  # a second row of 8 would pad the run to 16


def test_first_row_always_gets_a_chunk() -> None:
    limits = Limits(max_sequences=2, max_kv_tokens=1000, prefill_chunk=64, step_tokens=2)
    assert prefill_chunks([(req("a", 50), 10)], limits) == {"a": 2}


@pytest.mark.parametrize(
    ("prompts", "decodes", "last", "expected"),
    [
        (True, True, "decode", "prefill"),  # a waiting prompt starts at the next run
        (True, True, None, "prefill"),
        (True, True, "prefill", "decode"),  # decoders are never skipped twice in a row
        (True, False, "prefill", "prefill"),  # nobody decodes: prompts go on
        (False, True, "decode", "decode"),
        (False, True, "prefill", "decode"),
        (False, False, "decode", None),
    ],
)
def test_next_run_alternates_while_both_wait(
    prompts: bool, decodes: bool, last: RunKind | None, expected: RunKind | None
) -> None:
    assert next_run(prompts, decodes, last) == expected


def test_a_request_arriving_while_others_decode_is_fed_at_the_next_run() -> None:
    """Eight sequences decode; a short request arrives. Whatever ran last, its prompt is
    fed within two runs, and no decoding sequence goes two runs without a token."""
    limits = Limits(max_sequences=16, max_kv_tokens=1000, prefill_chunk=64, step_tokens=256)
    running = [decoding(req(f"long{i}", 40, 60), [1] * 10) for i in range(8)]
    short = req("short", 40, 16, arrived=1)
    lasts: tuple[RunKind, ...] = ("decode", "prefill")
    for last in lasts:
        plan = plan_step(running, [short], 0, limits, last_run=last)
        assert plan.admit == ("short",)
        if plan.run == "decode":
            assert dict(plan.feed) == {f"long{i}": 1 for i in range(8)}
            # the next step: the short request runs; it is running now, nothing fed yet
            admitted = SeqState(short)
            plan = plan_step([*running, admitted], [], 0, limits, last_run="decode")
        assert plan.run == "prefill"
        assert dict(plan.feed) == {"short": 40}  # its whole prompt: its first token


def test_nothing_to_run() -> None:
    plan = plan_step([], [], 0, WIDE, last_run="decode")
    assert plan.run is None and not plan.feed


def test_leaving_on_stop_length_and_deadline() -> None:
    running = [
        decoding(req("stopped"), [5, 99]),
        decoding(req("full", max_new=3), [5, 6, 7]),
        decoding(req("late", deadline=50), [5]),
        decoding(req("going", deadline=500), [5]),
    ]
    plan = plan_step(running, [], 100, WIDE)
    assert plan.leave == (
        Leave("stopped", "stop"),
        Leave("full", "length"),
        Leave("late", "deadline"),
    )
    assert dict(plan.feed) == {"going": 1}


def test_pool_full_waits_without_preemption_then_high_priority_first() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=20, prefill_chunk=8, step_tokens=64)
    running = [decoding(req("r1", 5, 5), [1]), decoding(req("r2", 5, 5), [1])]  # 20 of 20
    waiting = [
        req("low-small", 2, 2, priority=2, arrived=0),
        req("high", 5, 5, priority=1, arrived=9),
    ]
    plan = plan_step(running, waiting, 0, limits)
    assert plan.admit == () and plan.leave == () and plan.reject == ()
    assert set(plan.feed) == {"r1", "r2"}  # nobody preempted

    # r1 finishes: 10 tokens free. The high-priority request goes first even though the
    # low-priority one arrived earlier; both fit now.
    running[0].generated = [1, 99]
    plan = plan_step(running, waiting, 1, limits)
    assert plan.leave == (Leave("r1", "stop"),)
    assert plan.admit == ("high",)  # 10 + 10 = 20: low-small must still wait


def test_lower_priority_does_not_jump_a_blocked_higher_one() -> None:
    limits = Limits(max_sequences=8, max_kv_tokens=20, prefill_chunk=8, step_tokens=64)
    running = [decoding(req("r1", 5, 5))]  # 10 of 20 used
    waiting = [req("high-big", 8, 8, priority=1), req("low-small", 2, 2, priority=2)]
    plan = plan_step(running, waiting, 0, limits)
    assert plan.admit == ()  # low-small would fit, but would delay high-big further


def test_waiting_request_dropped_at_its_deadline() -> None:
    limits = Limits(max_sequences=1, max_kv_tokens=1000, prefill_chunk=8, step_tokens=64)
    running = [decoding(req("r1"))]
    waiting = [req("w", deadline=100)]
    assert plan_step(running, waiting, 99, limits).reject == ()
    plan = plan_step(running, waiting, 100, limits)
    assert plan.reject == (Reject("w", "deadline"),)
    assert plan.admit == ()


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        GenRequest("x", (), 3)
    with pytest.raises(ValueError):
        GenRequest("x", (1,), 0)
    with pytest.raises(ValueError):
        Limits(max_sequences=8, step_tokens=4)
