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
expired unanswered). A slow model's queue can hold its whole deadline's worth of work with fewer
calls in flight than the initial limit, and nothing else would shrink it (measured on
MiniLM-L6, long texts at 2x with 2 s deadlines: accepted requests waited 1.4-1.8 s). Late
requests never grow the limit, and bring it down to what drains in time: as many as are
computed in DRAIN_SHARE of the class's deadline budget at the rate its requests were
computed lately (Little's law). The shortest wait alone does not see lateness: with
several length buckets and tiers, a short text's request starts at once while long ones
wait out their deadlines (MiniLM at 2x: shortest wait 0 while 35 of 38 were late, and the
limit grew until the queue held a second of work). Where the limit refused nobody in the
interval, the cut keeps as many as were in flight the interval before (`_kept`): the
callers of a closed loop at capacity are not refused for a late one among them, and a
surge that began in the interval is cut to where the callers were before it. Above
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

A slow model keeps the same rules at its own scale: its target wait is at least one batch's
compute (smoothed over intervals), and an interval lasts at least two of them. MiniLM on
one core computes a batch in 100-400 ms, and a request of one length bucket waits 20-60 ms
for another bucket's batch: against the 10 ms target one such interval halved the limit
under the 32 closed-loop callers that measure capacity, whose refusals (~15k/s, each
retried at once) then took the core from the workers. And a 100 ms interval is shorter than
a MiniLM request takes to say how long it waited: in slow start the limit doubled from 7 to
235 in a second before any request the doubling let in came back, and 4% of the requests
taken at 2x expired.

A refusal says when to come back from the measured drain rate: the time the class's
excess takes to finish at the rate its requests finished lately.

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
# A slow model's scale (the batch compute of its class's requests, smoothed over intervals
# as the rate is): its target wait is at least one batch's compute, and an interval lasts at
# least FEEDBACK_COMPUTES of them (what a request admitted now takes to say how long it
# waited: a wait at the target and its own batch). See `AdaptiveLimits`.
FEEDBACK_COMPUTES = 2
# An interval with late requests brings the limit down to what is computed in this share of
# the class's deadline budget at the rate its requests were computed lately (Little's law).
DRAIN_SHARE = 0.4
# But no longer than this: a deeper queue makes bigger batches, and MiniLM's took 200-490 ms
# at 2x, intervals of up to a second.
MAX_INTERVAL_NS = 3 * INTERVAL_NS


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
    computed: int = 0  # requests finished this interval with a batch compute
    compute_sum_ns: int = 0  # and the sum of those computes
    compute_ns: float = 0.0  # a finished request's batch compute, smoothed over intervals
    served_per_s: float = 0.0  # requests computed a second (not expired), smoothed
    budgeted: int = 0  # requests ended this interval with a deadline
    budget_sum_ns: int = 0  # and the sum of their budgets (received -> deadline)
    budget_ns: float = 0.0  # an ended request's budget, smoothed over intervals
    last_peak: int = 0  # the most in flight at once in the interval before this one


@dataclass(slots=True)
class AdaptiveLimits:
    """Owned by the gateway's data plane (one per gateway, every class in it)."""

    maximum: int
    target_wait_ms: float
    fallback_retry_ms: int
    _classes: dict[LimitKey, _Class] = field(default_factory=dict)

    def acquire(self, key: LimitKey, now_ns: int) -> int:
        """0: admitted (release it once); otherwise refused, and the retry-after in ms."""
        c = self._class(key, now_ns)
        if c.in_flight >= self.limit_of(c):
            c.refused += 1
            return self._retry_ms(c)
        c.in_flight += 1
        c.peak = max(c.peak, c.in_flight)
        return 0

    def release(
        self,
        key: LimitKey,
        now_ns: int,
        wait_ns: int | None,
        late: bool = False,
        compute_ns: int = 0,
        budget_ns: int = 0,
    ) -> None:
        """An admitted request ended: `wait_ns` its queue wait (`queue_wait_ns`; all its
        time when it expired unanswered); None when it says nothing of the queue
        (refused further in, its caller left, failed before a worker took it). `late`:
        it expired, or waited past LATE_SHARE of its deadline (`is_late`). `compute_ns`:
        its batch's compute (`batch_compute_ns`; 0 when it has none); `budget_ns`, its
        deadline budget (received -> deadline; 0: none)."""
        c = self._class(key, now_ns)
        c.in_flight = max(0, c.in_flight - 1)
        c.ended += 1
        c.late += int(late)
        if budget_ns > 0:
            c.budgeted += 1
            c.budget_sum_ns += budget_ns
        if wait_ns is None:
            return
        c.finished += 1
        if compute_ns > 0:
            c.computed += 1
            c.compute_sum_ns += compute_ns
        if c.min_wait_ns < 0 or wait_ns < c.min_wait_ns:
            c.min_wait_ns = wait_ns

    def limit(self, key: LimitKey) -> int:
        c = self._classes.get(key)
        return self.limit_of(c) if c is not None else min(INITIAL, self.maximum)

    def limit_of(self, c: _Class) -> int:
        return max(MINIMUM, min(self.maximum, math.floor(c.limit)))

    def _retry_ms(self, c: _Class) -> int:
        if c.rate_per_s <= 0:
            return self.fallback_retry_ms
        excess = c.in_flight - self.limit_of(c) + 1
        ms = math.ceil(excess * 1000 / c.rate_per_s)
        return max(MIN_RETRY_MS, min(MAX_RETRY_MS, ms))

    def _class(self, key: LimitKey, now_ns: int) -> _Class:
        c = self._classes.get(key)
        if c is None:
            c = self._classes[key] = _Class(float(min(INITIAL, self.maximum)), now_ns)
        elif now_ns - c.start_ns >= interval_ns(c.compute_ns):
            self._adjust(c, now_ns)
        return c

    def _adjust(self, c: _Class, now_ns: int) -> None:
        """The interval that began at c.start_ns is over: the new limit and rate."""
        elapsed_s = (now_ns - c.start_ns) / 1e9
        idle = c.in_flight == 0 and now_ns - c.start_ns >= 2 * interval_ns(c.compute_ns)
        # This interval's measures count in the step that ends it. An idle stretch of many
        # intervals says nothing of the drain rate.
        if c.ended:
            c.rate_per_s = _smoothed(c.rate_per_s, c.ended / elapsed_s)
            c.served_per_s = _smoothed(c.served_per_s, c.computed / elapsed_s)
        if c.computed:
            c.compute_ns = _smoothed(c.compute_ns, c.compute_sum_ns // c.computed)
        if c.budgeted:
            c.budget_ns = _smoothed(c.budget_ns, c.budget_sum_ns // c.budgeted)
        if idle:
            # Nothing in flight since at least an interval ago: idle, its queue drained.
            c.slow_start = True
        else:
            limit = next_limit(
                c.limit,
                c.min_wait_ns if c.finished else None,
                bound=c.refused > 0 or c.peak >= self.limit_of(c) or c.late > 0,
                target_ns=max(int(self.target_wait_ms * 1_000_000), int(c.compute_ns)),
                slow_start=c.slow_start,
            )
            if c.late:  # never up, and down to what drains in time
                limit = min(limit, c.limit, max(_drains(c), _kept(c)))
            c.slow_start = c.slow_start and not c.late and limit >= c.limit
            c.limit = limit
        c.limit = max(float(MINIMUM), min(float(self.maximum), c.limit))
        c.start_ns = now_ns
        c.last_peak, c.peak = c.peak, c.in_flight
        c.refused = c.finished = c.ended = c.late = 0
        c.computed = c.compute_sum_ns = c.budgeted = c.budget_sum_ns = 0
        c.min_wait_ns = -1


def _smoothed(old: float, new: float) -> float:
    """The next value of a figure smoothed over intervals (its first measure as it is)."""
    return new if old <= 0 else (1 - RATE_SMOOTHING) * old + RATE_SMOOTHING * new


def interval_ns(compute_ns: float) -> float:
    """How long a class's interval lasts: INTERVAL_NS, or FEEDBACK_COMPUTES of its smoothed
    batch compute where that is longer."""
    return max(float(INTERVAL_NS), min(FEEDBACK_COMPUTES * compute_ns, MAX_INTERVAL_NS))


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
    return max(0, wait - batch_compute_ns(timing))


def batch_compute_ns(timing: Timing) -> int:
    """How long an answered request's batch computed (0 where it was not batched)."""
    return max(0, timing.batch_end_ns - timing.batch_start_ns)


def _kept(c: _Class) -> float:
    """What a late cut leaves to callers the limit refused none of: as many as were in
    flight the interval before. 32 closed-loop callers at capacity wait past a quarter of
    their deadline now and then, and a cut under them refused the callers, whose retries
    took the core (MiniLM: 8-20k refusals at 1x); a surge's first interval is cut to where
    the callers were before it."""
    return 0.0 if c.refused else float(c.last_peak)


def _drains(c: _Class) -> float:
    """How many of the class's requests drain in DRAIN_SHARE of its deadline budget at the
    rate its requests were computed (Little's law; those that expired or left drained
    nothing); unbounded while either is unknown."""
    if c.served_per_s <= 0 or c.budget_ns <= 0:
        return math.inf
    return c.served_per_s * c.budget_ns / 1e9 * DRAIN_SHARE


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
