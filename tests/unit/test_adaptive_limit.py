"""The adaptive in-flight limits on an integer clock: shrink on a standing queue, grow while
they hold calls back and the queue is short, per class, with retry-after from the drain."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tiermesh.core.jobs import Timing
from tiermesh.gateway.adaptive_limit import (
    INITIAL,
    INTERVAL_NS,
    LATE_SHARE,
    MAX_RETRY_MS,
    MINIMUM,
    AdaptiveLimits,
    drain_cap,
    is_late,
    next_limit,
    queue_wait_ns,
)
from tiermesh.gateway.metrics import GatewayMetrics

MS = 1_000_000
KEY = ("mlp", 2)


def limits(maximum: int = 4096, target_ms: float = 10.0) -> AdaptiveLimits:
    return AdaptiveLimits(maximum=maximum, target_wait_ms=target_ms, fallback_retry_ms=100)


def fill(lim: AdaptiveLimits, key: tuple[str, int], now: int) -> int:
    """Acquire until refused; returns how many were admitted."""
    n = 0
    while lim.acquire(key, now) == 0:
        n += 1
    return n


def interval(
    lim: AdaptiveLimits,
    key: tuple[str, int],
    start: int,
    waits_ms: list[float],
    bound: bool = True,
) -> int:
    """One interval: requests released with these waits; `bound`, the class was filled to its
    limit (and one refused) first, the others released without a wait. Returns its end."""
    if bound:
        admitted = fill(lim, key, start)
        assert admitted >= len(waits_ms)
        for i in range(admitted):
            wait = int(waits_ms[i] * MS) if i < len(waits_ms) else None
            lim.release(key, start + 1, wait)
        return start + INTERVAL_NS
    for wait_ms in waits_ms:
        assert lim.acquire(key, start) == 0
        lim.release(key, start + 1, int(wait_ms * MS))
    return start + INTERVAL_NS


def test_a_class_starts_at_the_initial_limit_and_refuses_beyond_it() -> None:
    lim = limits()
    assert fill(lim, KEY, 0) == INITIAL
    assert lim.acquire(KEY, 0) == 100  # no drain rate measured yet: the fallback
    lim.release(KEY, 1, None)
    assert lim.acquire(KEY, 2) == 0


def test_the_fixed_cap_bounds_the_initial_limit() -> None:
    assert fill(limits(maximum=16), KEY, 0) == 16


def test_a_standing_queue_shrinks_the_limit_in_proportion() -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [40.0, 50.0, 60.0])  # shortest wait 40 ms, target 10
    lim.acquire(KEY, now)  # the interval's end is seen on the next call
    assert lim.limit(KEY) == INITIAL // 2  # shrinks by at most half an interval
    now = interval(lim, KEY, now, [12.5] * 3)
    lim.acquire(KEY, now)
    assert lim.limit(KEY) == int(INITIAL // 2 * 10 / 12.5)


def test_one_short_wait_means_no_standing_queue() -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [400.0, 3.0, 900.0])
    lim.acquire(KEY, now)
    assert lim.limit(KEY) > INITIAL  # bound and no standing queue: it grows


def test_the_limit_grows_only_while_it_holds_calls_back_and_the_queue_is_short() -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [2.0] * 5, bound=False)  # never near the limit: kept
    lim.acquire(KEY, now)
    lim.release(KEY, now, None)
    assert lim.limit(KEY) == INITIAL
    admitted = fill(lim, KEY, now)  # at the limit, refusing
    assert admitted == INITIAL
    for _ in range(3):
        lim.release(KEY, now + 1, 2 * MS)
    lim.acquire(KEY, now + INTERVAL_NS)
    assert lim.limit(KEY) == INITIAL + int(INITIAL * 0.1)  # a tenth: more than the root (16)


def test_an_interval_with_no_finished_request_changes_nothing() -> None:
    lim = limits()
    fill(lim, KEY, 0)  # bound, but nothing came back: no sign the queue is short
    lim.acquire(KEY, INTERVAL_NS)
    assert lim.limit(KEY) == INITIAL


def test_the_limit_stays_within_its_minimum_and_the_cap() -> None:
    lim = limits(maximum=300)
    now = 0
    for _ in range(20):
        now = interval(lim, KEY, now, [1000.0])
    lim.acquire(KEY, now)
    assert lim.limit(KEY) == MINIMUM
    assert next_limit(290.0, MS, bound=True, target_ns=10 * MS) == 319.0
    assert next_limit(4.0, MS, bound=True, target_ns=10 * MS) == 6.0  # the root
    lim2 = limits(maximum=300)
    now = 0
    for _ in range(10):
        fill(lim2, KEY, now)
        lim2.release(KEY, now + 1, MS)
        now += INTERVAL_NS
    assert lim2.limit(KEY) == 300


def test_classes_are_separate_so_the_flooding_priority_is_the_one_refused() -> None:
    lim = limits()
    urgent, flood = ("mlp", 1), ("mlp", 2)
    now = 0
    for _ in range(6):
        interval(lim, flood, now, [200.0] * 3)  # at its limit, waiting long
        now = interval(lim, urgent, now, [3.0], bound=False)
    lim.acquire(flood, now)
    lim.acquire(urgent, now)
    assert lim.limit(flood) < INITIAL // 8
    assert lim.limit(urgent) == INITIAL


def test_retry_after_is_the_excess_at_the_measured_drain_rate_in_a_line() -> None:
    lim = limits()
    # 50 requests finished in one interval (100 ms): 500 a second.
    now = interval(lim, KEY, 0, [2.0] * 50, bound=False)
    admitted = 0
    while (retry := lim.acquire(KEY, now)) == 0:
        admitted += 1
    assert admitted == INITIAL
    # One over the limit at 500/s: 2 ms; each caller refused after it one drain gap later.
    assert retry == 2
    assert [lim.acquire(KEY, now) for _ in range(3)] == [4, 6, 8]
    # 5 ms on, the line's end is 3 ms away: the next caller's turn is 2 ms after it.
    assert lim.acquire(KEY, now + 5_000_000) == 5
    # Once the line has gone by, a refused caller waits the excess alone again.
    assert lim.acquire(KEY, now + 50_000_000) == 2


def test_the_line_is_at_most_the_longest_retry_after() -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [2.0] * 50, bound=False)  # 500 a second
    fill(lim, KEY, now)
    retries = [lim.acquire(KEY, now) for _ in range(600)]  # 1.2 s of the class's drain
    assert retries[:3] == [4, 6, 8]
    assert retries[-100:] == [MAX_RETRY_MS] * 100
    # a caller refused later is told to come back no later than the longest, either
    assert lim.acquire(KEY, now + 100_000) == MAX_RETRY_MS


@pytest.mark.parametrize("finished", [0, 1])
def test_retry_after_is_bounded(finished: int) -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [2.0] * finished, bound=False)
    now += 10 * INTERVAL_NS  # a long idle stretch: the rate measured is tiny
    lim.acquire(KEY, now)
    fill(lim, KEY, now)
    retry = lim.acquire(KEY, now)
    assert 1 <= retry <= (MAX_RETRY_MS if finished else 100)


def test_an_expired_request_counts_its_whole_time_as_wait() -> None:
    lim = limits()
    now = interval(lim, KEY, 0, [1000.0])  # the one that came back had expired
    lim.acquire(KEY, now)
    assert lim.limit(KEY) == INITIAL // 2


def test_the_signal_is_the_queue_wait_beyond_one_batchs_compute() -> None:
    # enqueued at 2, batch 50 -> 140: waited 48 ms, its batch computed 90: no queue beyond it.
    timing = Timing(
        received_ns=1, enqueued_ns=2 * MS, batch_start_ns=50 * MS, batch_end_ns=140 * MS
    )
    assert queue_wait_ns(timing) == 0
    timing = Timing(
        received_ns=1, enqueued_ns=2 * MS, batch_start_ns=150 * MS, batch_end_ns=240 * MS
    )
    assert queue_wait_ns(timing) == 58 * MS


def test_a_limit_its_callers_do_not_reach_is_left_alone() -> None:
    """Four callers whose requests wait long (closed-loop callers of a saturated mesh wait
    behind each other's batches), nothing refused, nothing expired: shrinking toward them
    would refuse them and starve the workers."""
    lim = limits()
    now = 0
    for _ in range(10):
        now = interval(lim, KEY, now, [90.0] * 4, bound=False)
    lim.acquire(KEY, now)
    assert lim.limit(KEY) == INITIAL


def test_a_late_request_shrinks_a_limit_its_callers_do_not_reach() -> None:
    """A slow model's queue can hold a deadline's worth of work with fewer in flight than
    the limit: the callers never reach it, and the requests it let in wait most of their
    deadline. Each late one lets the limit shrink; the same waits on time leave it alone."""
    lim = limits()
    now = 0
    expected = float(INITIAL)
    for _ in range(3):
        for _ in range(20):  # in flight at once: well under the limit
            assert lim.acquire(KEY, now) == 0
        for i in range(20):
            lim.release(KEY, now + 1, 900 * MS, late=i == 0)
        now += INTERVAL_NS
        lim.acquire(KEY, now)
        lim.release(KEY, now, None)
        expected *= 0.5  # the wait is far above the target: at most halved
        assert lim.limit(KEY) == int(expected)


def test_a_class_idle_for_an_interval_starts_slowly_and_doubles_until_it_shrinks() -> None:
    """A flood shrank the limit and ended; its last answers waited long. Once nothing was in
    flight for a whole interval the queue is empty: those waits are not applied, and the
    callers that come next (32 closed-loop callers at capacity) see it double each interval
    they are refused with a short queue, not grow by its root; the first shrink ends that."""
    lim = limits()
    now = 0
    for _ in range(5):
        now = interval(lim, KEY, now, [80.0])
    low = lim.limit(KEY)
    assert low == INITIAL // 16
    lim.acquire(KEY, now)
    lim.release(KEY, now + 1, 80 * MS)  # the flood's last answer, waited long
    shrunk = lim.limit(KEY)
    assert shrunk < low
    # Idle: nothing in flight since the flood's last answer, for more than an interval.
    now += 3 * INTERVAL_NS
    assert lim.acquire(KEY, now) == 0
    lim.release(KEY, now, None)
    assert lim.limit(KEY) == shrunk  # the last answer's wait is not applied after idle
    for _ in range(3):
        now = interval(lim, KEY, now, [1.0])
        lim.acquire(KEY, now)
        lim.release(KEY, now, None)
        shrunk *= 2
        assert lim.limit(KEY) == shrunk
    now = interval(lim, KEY, now, [20.0])  # a standing queue again: halves, ends it
    lim.acquire(KEY, now)
    lim.release(KEY, now, None)
    assert lim.limit(KEY) == shrunk // 2
    grown = lim.limit(KEY)
    now = interval(lim, KEY, now, [1.0])
    lim.acquire(KEY, now)
    assert lim.limit(KEY) == int(grown + max(1.0, grown**0.5, grown * 0.1))
    # A request in flight across the quiet stretch: not idle, the interval's waits count.
    busy = limits()
    t = interval(busy, KEY, 0, [80.0])
    assert busy.acquire(KEY, t) == 0
    busy.acquire(KEY, t + 3 * INTERVAL_NS)
    assert busy.limit(KEY) == INITIAL // 2
    assert next_limit(10.0, MS, bound=True, target_ns=10 * MS, slow_start=True) == 20.0
    assert next_limit(10.0, 20 * MS, bound=True, target_ns=10 * MS, slow_start=True) == 5.0
    assert next_limit(10.0, MS, bound=False, target_ns=10 * MS, slow_start=True) == 10.0


@pytest.mark.parametrize(
    ("wait_ms", "budget_ms", "expired", "late"),
    [
        (None, 1000, True, True),  # expired unanswered
        (250, 1000, False, False),  # a quarter of its deadline: on time
        (251, 1000, False, True),
        (900, 0, False, False),  # no deadline: never late by its wait
        (None, 1000, False, False),  # says nothing of the queue
    ],
)
def test_late(wait_ms: int | None, budget_ms: int, expired: bool, late: bool) -> None:
    wait = None if wait_ms is None else wait_ms * MS
    assert is_late(wait, budget_ms * MS, expired) is late


def test_the_drain_cap_admits_what_drains_in_a_quarter_of_the_deadline() -> None:
    """Learnt while the class is held back: 100 released an interval (~1,000 a second) is
    its drain; a request with a 102 ms budget is then admitted only while fewer than
    1,000 x LATE_SHARE x 0.102 s = 25.5 are in flight, one without a deadline up to the
    limit."""
    lim = limits()
    now = 0
    in_flight = fill(lim, KEY, now)  # held back: one refused
    for _ in range(3):
        for _ in range(100):
            lim.release(KEY, now + 1, MS)
        in_flight += fill(lim, KEY, now + 1) - 100
        now += INTERVAL_NS
    for _ in range(in_flight):
        lim.release(KEY, now + 1, MS)
    budget = 102 * MS
    assert 1000 * LATE_SHARE * 0.102 == pytest.approx(25.5)
    assert lim.limit(KEY, budget) == 25 < lim.limit(KEY)
    assert [lim.acquire(KEY, now + 2, budget) for _ in range(25)] == [0] * 25
    # Refused: one in excess at ~1,000 a second is 1 ms (rounded up).
    assert lim.acquire(KEY, now + 2, budget) in (1, 2)
    assert lim.acquire(KEY, now + 2) == 0  # no deadline: the limit alone
    assert lim.limit(KEY, 20 * budget) == lim.limit(KEY)  # a long deadline: the limit binds


def test_no_drain_cap_before_the_class_was_held_back() -> None:
    """A class that was never held back or late has no drain rate: its rate is its
    traffic, not what it can drain, and a burst after a quiet spell is not refused for it."""
    lim = limits()
    now = 0
    for _ in range(5):  # 10 a second, never refused nor late
        now = interval(lim, KEY, now, [1.0], bound=False)
    assert lim.acquire(KEY, now, 100 * MS) == 0
    assert lim.limit(KEY, 100 * MS) == lim.limit(KEY) == INITIAL
    assert drain_cap(0.0, 100 * MS) > INITIAL and drain_cap(1000.0, 0) > INITIAL
    assert drain_cap(1.0, 100 * MS) == MINIMUM  # never below the floor


def test_the_limits_are_exported_by_class() -> None:
    """Scrape-time gauges of every class: its limit, its drain rate, its calls in flight."""
    lim = limits()
    registry = CollectorRegistry()
    GatewayMetrics(registry).watch_limits(lim)
    assert b"tiermesh_admission_limit{" not in generate_latest(registry)  # no class yet
    fill(lim, KEY, 0)  # held back: one refused
    for _ in range(100):
        lim.release(KEY, 1, MS)
    lim.acquire(("minilm-l6", 1), INTERVAL_NS)
    lim.acquire(KEY, INTERVAL_NS)  # KEY's interval ends: ~1,000 a second drained
    assert lim.classes() == [
        (("minilm-l6", 1), INITIAL, 0.0, 1),
        (KEY, lim.limit(KEY), pytest.approx(1000.0, rel=1e-6), INITIAL - 100 + 1),
    ]
    text = generate_latest(registry).decode()
    assert 'tiermesh_admission_limit{model="mlp",priority="2"} ' + f"{lim.limit(KEY)}.0" in text
    assert 'tiermesh_admission_in_flight{model="minilm-l6",priority="1"} 1.0' in text
    assert 'tiermesh_admission_drain_per_second{model="minilm-l6",priority="1"} 0.0' in text
    assert 'tiermesh_admission_drain_per_second{model="mlp",priority="2"} 1000.0' in text
