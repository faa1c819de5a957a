"""Adaptive in-flight limits per (model, priority): how many requests of one class the
gateway lets into the mesh at once, learnt from how long its admitted requests waited.

A standing queue is what overload looks like from here: every request waits, the luckiest
too. So, as CoDel does, the signal is the *smallest* wait among the class's requests that
finished in an interval (100 ms): the wait in the work queue, from its enqueueing to its
batch's start, less the compute of one batch (`queue_wait_ns`), which is what admitting
fewer shortens. (The time before it, the gateway's and the router's CPU, grows too while a
flood is refused; shrinking the limit for it starved the workers: measured on the mlp, one
core, 5x: goodput 0.4x against 0.7x.) The limit changes only while it held calls back (some
were refused, or as many were in flight as it allows) or let in too many: a request it let
in was late (`is_late`: it waited more than a quarter of its deadline in the queue, or
expired unanswered). A slow model's queue can hold its whole deadline's worth of work with
fewer calls in flight than the initial limit, and nothing else would shrink it (measured on
MiniLM-L6, long texts at 2x with 2 s deadlines: accepted requests waited 1.4-1.8 s). Above
the target it shrinks in proportion, at most by half an interval (shrinking sooner, on a
flood's first answers, collapsed it: the workers' wake-ups are late too while a core is busy
refusing); at or below it, it grows by its square root or a tenth, whichever is more (from
the floor back to 32 in 0.8 s). A limit its callers do not reach, and whose requests are not
late, is left alone: closed-loop callers of a saturated mesh wait behind each other's
batches, and shrinking toward them refused them and starved the workers (mesh_vs_raw, 64
callers: 0.77 -> 0.4 of the raw limit). A request that reached its deadline unanswered
counts as a wait of all its time. A class that had nothing in flight for a whole interval
starts slowly, as TCP does after idle: its queue drained, so the interval's waits are not
applied, and until it next shrinks it doubles where it would grow (after a 5x flood whose
limit ended at 10-30, 32 closed-loop callers were refused up to 7% of their calls while it
grew back by its root; resetting it to the initial limit instead made the next flood's
accepted p99 ~60% longer). Priorities are separate classes: a low-priority flood waits
behind the workers' weighting of the levels, and its limit shrinks while the urgent class's
does not, so the flood is what is refused.

Beside the limit, a cap from the deadline (Little's law): a request is admitted only while
fewer of its class are in flight than drain in LATE_SHARE of its own deadline budget at the
class's drain rate, measured while the class was held back or late (its capacity, not its
traffic: a slow EWMA of the release rate over those intervals; none measured yet: no cap).
The gradient learns from waits after the fact, so on a slow model it swung between the
floor and ~60 while the queue's depth was its callers' to make; and after an idle spell its
slow start doubled to 160 in 0.6 s at the start of a 5x flood on MiniLM-L6 (~125
requests a second): a queue of 1.3 s against 1 s deadlines, 132 requests expired. The cap
says up front how many drain in time (~30 there); it does not bind the mlp (~3,000 a second,
~750 drain in a quarter of a second, its gradient limit stays lower).

A refusal says when to come back from the measured drain rate: the time the class's
excess takes to finish at the rate its requests finished lately, and no sooner than one
drain gap (1 / that rate) after the caller refused before it was told to come back. The
refused callers are given a line, as a ticket machine does: a crowd that waits what it is
told comes back at the rate the class drains, not all at once (160 closed-loop callers on
MiniLM-L6 told the same few ms came back ~8,000 times a second against ~140 served, and the
refusals took a third of the mesh's core).

Pure: callers pass `now_ns`; the gateway (gateway/plane.py) and the Go front door
(frontdoor/go/limit.go) run the same rules with the same constants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tiermesh.core.jobs import Timing

LimitKey = tuple[str, int]  # (model, priority level)

INTERVAL_NS = 100_000_000
# The limit a class starts from: room for a burst, a short transient under a flood.
INITIAL = 256
MINIMUM = 4
GROWTH = 0.1
MAX_SHRINK = 0.5
# A request that waited in the queue more than this share of its deadline budget (or expired
# unanswered) is late: the limit let in too many, whether or not its callers reached it.
LATE_SHARE = 0.25
# Retry-after bounds (ms) and the rate's smoothing.
MIN_RETRY_MS = 1
MAX_RETRY_MS = 1000
RATE_SMOOTHING = 0.5
# The drain rate's smoothing, over the intervals the class was held back or late (~1 s: a
# slow model's answers come in lumps of a batch, 0 to 300 a second interval by interval).
DRAIN_SMOOTHING = 0.1


@dataclass(slots=True)
class _Class:
    limit: float
    start_ns: int
    in_flight: int = 0
    peak: int = 0  # most in flight at once this interval
    refused: int = 0
    finished: int = 0  # finished with a wait this interval
    min_wait_ns: int = -1
    rate_per_s: float = 0.0  # requests finished a second, smoothed over intervals
    ended: int = 0  # every release this interval (with or without a wait)
    late: int = 0  # released this interval having waited past LATE_SHARE of its deadline
    slow_start: bool = False  # idle since it last shrank: it doubles where it would grow
    drain_per_s: float = 0.0  # releases a second while held back or late (0: not yet)
    line_ns: int = 0  # when the last refused caller was told to come back


@dataclass(slots=True)
class AdaptiveLimits:
    """Owned by the gateway's data plane (one per gateway, every class in it)."""

    maximum: int
    target_wait_ms: float
    fallback_retry_ms: int
    _classes: dict[LimitKey, _Class] = field(default_factory=dict)

    def acquire(self, key: LimitKey, now_ns: int, budget_ns: int = 0) -> int:
        """0: admitted (release it once); otherwise refused, and the retry-after in ms.
        `budget_ns`: the request's deadline budget (received -> deadline; 0: none)."""
        c = self._class(key, now_ns)
        allowed = self._allowed(c, budget_ns)
        if c.in_flight >= allowed:
            c.refused += 1
            return self._retry_ms(c, allowed, now_ns)
        c.in_flight += 1
        c.peak = max(c.peak, c.in_flight)
        return 0

    def release(self, key: LimitKey, now_ns: int, wait_ns: int | None, late: bool = False) -> None:
        """An admitted request ended: `wait_ns` its queue wait (`queue_wait_ns`; all its
        time when it expired unanswered); None when it says nothing of the queue
        (refused further in, its caller left, failed before a worker took it). `late`:
        it expired, or waited past LATE_SHARE of its deadline (`is_late`)."""
        c = self._class(key, now_ns)
        c.in_flight = max(0, c.in_flight - 1)
        c.ended += 1
        c.late += int(late)
        if wait_ns is None:
            return
        c.finished += 1
        if c.min_wait_ns < 0 or wait_ns < c.min_wait_ns:
            c.min_wait_ns = wait_ns

    def limit(self, key: LimitKey, budget_ns: int = 0) -> int:
        """How many of the class may be in flight, for a request with `budget_ns`."""
        c = self._classes.get(key)
        if c is None:
            return min(INITIAL, self.maximum)
        return self._allowed(c, budget_ns)

    def classes(self) -> list[tuple[LimitKey, int, float, int]]:
        """Every class as (key, limit, drain rate a second (0: not measured), in flight),
        in key order: the metrics' view (read from the metrics thread: a copy first)."""
        items = sorted(list(self._classes.items()), key=lambda kc: kc[0])
        return [(k, self.limit_of(c), c.drain_per_s, c.in_flight) for k, c in items]

    def limit_of(self, c: _Class) -> int:
        return max(MINIMUM, min(self.maximum, math.floor(c.limit)))

    def _allowed(self, c: _Class, budget_ns: int) -> int:
        """The limit, or the drain cap for a request with `budget_ns` where that is lower."""
        return min(self.limit_of(c), drain_cap(c.drain_per_s, budget_ns))

    def _retry_ms(self, c: _Class, allowed: int, now_ns: int) -> int:
        """When a refused caller may come back: once the excess in flight drained, and one
        drain gap after the caller refused before it (at most MAX_RETRY_MS)."""
        if c.rate_per_s <= 0:
            return self.fallback_retry_ms
        gap_ns = 1e9 / c.rate_per_s
        wait_ns = max((c.in_flight - allowed + 1) * gap_ns, float(c.line_ns - now_ns) + gap_ns)
        wait_ns = min(wait_ns, MAX_RETRY_MS * 1e6)
        c.line_ns = now_ns + int(wait_ns)
        ms = math.ceil(wait_ns / 1e6)
        return max(MIN_RETRY_MS, min(MAX_RETRY_MS, ms))

    def _class(self, key: LimitKey, now_ns: int) -> _Class:
        c = self._classes.get(key)
        if c is None:
            c = self._classes[key] = _Class(float(min(INITIAL, self.maximum)), now_ns)
        elif now_ns - c.start_ns >= INTERVAL_NS:
            self._adjust(c, now_ns)
        return c

    def _adjust(self, c: _Class, now_ns: int) -> None:
        """The interval that began at c.start_ns is over: the new limit and rate."""
        elapsed_s = (now_ns - c.start_ns) / 1e9
        rate = c.ended / elapsed_s
        if c.in_flight == 0 and now_ns - c.start_ns >= 2 * INTERVAL_NS:
            # Nothing in flight since at least an interval ago: idle, its queue drained.
            c.slow_start = True
        else:
            bound = c.refused > 0 or c.peak >= self.limit_of(c) or c.late > 0
            limit = next_limit(
                c.limit,
                c.min_wait_ns if c.finished else None,
                bound=bound,
                target_ns=int(self.target_wait_ms * 1_000_000),
                slow_start=c.slow_start,
            )
            c.slow_start = c.slow_start and limit >= c.limit
            c.limit = limit
            if c.refused > 0 or c.late > 0:  # held back or late: the rate is its capacity
                c.drain_per_s = smoothed(c.drain_per_s, rate, DRAIN_SMOOTHING)
        c.limit = max(float(MINIMUM), min(float(self.maximum), c.limit))
        # An idle stretch of many intervals says nothing of the drain rate.
        if c.ended:
            c.rate_per_s = smoothed(c.rate_per_s, rate, RATE_SMOOTHING)
        c.start_ns = now_ns
        c.peak = c.in_flight
        c.refused = c.finished = c.ended = c.late = 0
        c.min_wait_ns = -1


def smoothed(old: float, new: float, weight: float) -> float:
    """An EWMA step; the first measure (`old` 0) is taken as it is."""
    return new if old <= 0 else (1 - weight) * old + weight * new


def drain_cap(drain_per_s: float, budget_ns: int) -> int:
    """How many of a class may be in flight for a request with `budget_ns` to be answered
    in LATE_SHARE of it at the class's drain rate (at least MINIMUM); no cap (a huge
    number) without a budget or a measured rate."""
    if budget_ns <= 0 or drain_per_s <= 0:
        return 1 << 62
    return max(MINIMUM, math.floor(drain_per_s * LATE_SHARE * budget_ns / 1e9))


def is_late(wait_ns: int | None, budget_ns: int, expired: bool) -> bool:
    """Whether a request's wait says the limit let in too many: it expired unanswered, or
    its queue wait took more than LATE_SHARE of its deadline budget (`budget_ns`, received
    -> deadline; 0: none)."""
    if expired:
        return True
    return wait_ns is not None and budget_ns > 0 and wait_ns > LATE_SHARE * budget_ns


def queue_wait_ns(timing: Timing) -> int:
    """The signal of one answered request: its wait in the work queue (enqueued -> its
    batch's start) less its batch's compute, at least 0. A request that came while a batch
    computed waits for it without any queue: a model whose batches take 90 ms shows waits
    of that much at 4 callers, and measured whole they shrank its limit to the floor."""
    wait = timing.batch_start_ns - timing.enqueued_ns
    compute = max(0, timing.batch_end_ns - timing.batch_start_ns)
    return max(0, wait - compute)


def next_limit(
    limit: float, min_wait_ns: int | None, *, bound: bool, target_ns: int, slow_start: bool = False
) -> float:
    """One interval's step, only while the limit held calls back or let in a request that was late
    (`bound`): shrink toward the target when even the shortest wait exceeded it, else grow
    by the root or a tenth (double, in `slow_start`). A limit the callers did not reach is
    otherwise left alone: 64 closed-loop callers of a saturated mesh wait behind each
    other's batches, and shrinking for that refused them and starved the workers
    (mesh_vs_raw: 0.77 -> 0.4 of the raw limit)."""
    if min_wait_ns is None or not bound:
        return limit
    if min_wait_ns > target_ns:
        return limit * max(MAX_SHRINK, target_ns / min_wait_ns)
    if slow_start:
        return 2 * limit
    return limit + max(1.0, math.sqrt(limit), limit * GROWTH)
