"""Which buffered stream a batcher-worker serves next, when its batch closes and how many
rows it takes. Pure and synchronous: every method takes `now_ns` from the caller (the clock
the deadlines use, ``time.time_ns`` in the worker); nothing here reads a clock, sleeps or
does I/O, so the whole policy is unit-tested with plain integers.

Policy
------
Picking a stream (`Scheduler.pick`, called once per batch the worker is about to form):

1. Aging. A view whose oldest entry has waited (``now - oldest_enqueued_ns``) longer than
   its level's ``scheduling.age_limit`` is overdue. If any view is overdue, the one with
   the largest excess over its limit is picked, whatever its priority (ties: higher
   priority, then lower bucket). So once a request turns overdue it is served at the next
   pick unless something is even more overdue: with one batch in flight, within its age
   limit plus one batch duration. An aging pick leaves the credits below untouched, and is
   never followed by another while views that are not overdue wait: under sustained
   overload aging takes at most every other batch, so higher levels keep at least half.
2. Weighted priority. Otherwise the competitors are the (compute unit, priority level)
   groups that have work, each with its model's ``scheduling.weight(level)``. Smooth
   weighted round-robin: every competitor gains its weight in credit, the one with the
   most credit wins (ties: higher priority, i.e. the lower level, then unit name) and pays
   the sum of the competitors' weights. Under sustained load a level with weight 4 against
   one with weight 1 gets exactly 4 of every 5 batches, interleaved, and the lighter level
   still progresses. A group without work at a pick forgets its credit, and the groups
   that have work share what it held, so credits always sum to zero. A group that comes
   and goes therefore starts even each time it returns: a priority-1 trickle beside a
   priority-2 flood is taken at the next batch boundary (weight 4 against 1, from even), not
   every fifth time it comes; a level-2 trickle beside a level-1 flood is served at the
   third pick at the latest. Kept credit would be the trickle's debt from its last win, and
   the flood's matching surplus, carried into every return.
3. Bucket within the group. The stream whose batch is nearest its wait limit goes first:
   smallest ``max_batch_wait_ms - waited`` with waited counted from ``first_dequeued_ns``
   (ties: lower bucket, then tier). Buckets never merge: a pick is one stream.

Closing a batch (`Scheduler.wait_ms` <= 0 means close now), when:
rows reach the bucket's ``max_batch_size``; or rows reach its largest preferred size; or
the oldest entry is overdue (see 1); or the batch wait is over; or waiting out the rest of
it and then computing would miss the earliest deadline:
``now + remaining_wait + compute_estimate(batch_rows) > earliest_deadline``; or (with the
model's ``batching.adaptive_wait``, the default) fewer than ``ROWS_WORTH_WAITING`` more
rows are expected in the rest of the wait at the stream's measured arrival rate
(`arrived`): a client that sends its next request only after this answer, or a trickle,
gets no batch wait at all, while a busy stream still waits for the rows that are coming.
The rate is an exponentially decayed count of arrived rows (time constant
``ARRIVAL_TAU_NS``) over that time constant; a stream nothing was recorded for waits the
whole wait. Otherwise the remaining wait in ms.

Batch size (`Scheduler.batch_rows`): at most the bucket's ``max_batch_size``; with
preferred sizes, the largest preferred size that fits in the rows waiting (Triton's
convention), else all rows up to the maximum. A target in rows; the caller takes whole
requests up to it.

Yielding to a higher level (`Scheduler.row_cap`): a lane computing a batch cannot be
preempted, so higher-priority work that arrives meanwhile waits for the batch to end. While
a higher level of the same unit has had traffic within ``HIGHER_PRESENT_NS`` (any row
read), a lower level's batch is cut to the most rows whose estimated compute fits in the
model's ``scheduling.yield_ms`` (at least one row): a per-bucket batch budget in padded
tokens (rows x the bucket's length, as TEI's ``--max-batch-tokens``) chosen from the
measured cost, so the higher level waits for a lane about that long at most. A batch at
its cut closes at once. Without higher-level traffic, or before the bucket's cost was
measured, batches are not cut: the full batch is the throughput-optimal one, and a worker
serving one level loses nothing.

Background work (batch jobs; streams at ``keys.BACKGROUND_PRIORITY``, below every online
level): never a candidate for aging or the weighted pick. While any online view has rows a
background view is picked only when background batches took less than ``background_share``
of the recent compute time (0, the default: never). With no online rows it is picked at
once, on every lane, unless paced (`background_wait_ms`). Pacing holds while online rows
keep arriving (their decayed count over the online streams is at least
``ONLINE_PRESENT_ROWS``), and follows the online queue delay this worker measures:

1. A lane for online work. At most ``lanes - 1`` background batches are in flight at once
   (one with a single lane; `background_started`, `background_done`), so an online request
   that arrives finds a lane free and does not wait for a batch it cannot preempt.
2. Online queue delay. The intake reports, for every read that brought online entries,
   the longest wait among them from enqueued (the router's XADD) to read here
   (`online_waited`): a request read late waited for this worker (its lanes, its loop) or
   for cores the background work took. While the latest such wait exceeds
   ``background_target_wait_ms``, no background batch starts; the first read within it
   lets them go again (at full rate: they pause only while online work is delayed).

A background batch closes at once (the feeder keeps enough queued) and takes
``background_rows``: the throughput-optimal size, i.e. the smallest batch whose per-row
cost under the fitted ``fixed + per_row * rows`` is within ``1 / (1 - BG_EFFICIENCY)`` of
the marginal cost (rows >= fixed / per_row * BG_EFFICIENCY / (1 - BG_EFFICIENCY)), capped
by the bucket's max_batch_size; the maximum itself before anything was measured. On a
one-lane worker, while online traffic is present, it is cut further to the rows estimated
to compute within the model's ``scheduling.yield_ms``, as `row_cap` cuts lower levels: a
background batch is never preempted, so it holds the lane no longer than that. With more
lanes online work has one of its own, and a cut would only add per-batch costs (a read of
the job's status, a write of its results, an ack) to every row of the job.
Its compute runs on threads the kernel treats as idle (worker/lanes.py ComputeThreads), and
it does not keep online batches off the loop's own thread (lanes.run_inline).

Compute estimate (`observe`, `compute_estimate_ns`), per (compute unit, bucket), shared by
tiers and online priorities (batch jobs have their own: they compute on idle threads, so
their times are stretched by whatever else runs): an exponentially weighted least-squares
fit of batch time against rows, ``t = fixed + per_row * rows``, with the per-row slope
clamped between 0 (all fixed cost) and ``mean_t / mean_rows`` (no fixed cost) so neither
part goes negative. While all observed batches had the same size the split is unknown and
the estimate takes the larger of the two readings (conservative, as deadlines want). No
observation yet: 0. It is the cost of a batch on a compute lane, hand-over included: a
batch computed on the loop's own thread (`inline`, faster: no hand-over, and the wide
session) counts in the background share only. Were it fitted too, it would lower the
estimate that decides what computes inline (lanes.run_inline) and the choice would keep
itself: a worker that started on lanes stayed there, one that started inline stayed
inline, by the luck of its first batches.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import BACKGROUND_PRIORITY, StreamKey
from tiermesh.core.model_config import ModelConfig

NS_PER_MS = 1_000_000
# Weight of the newest batch in the cost EWMAs: about the last ten batches count.
EWMA_ALPHA = 0.2
# Below this variance of observed batch sizes (rows squared) the fit has no slope to read.
_MIN_ROWS_VARIANCE = 1e-6
# A background batch reaches this share of the best throughput the cost fit allows.
BG_EFFICIENCY = 0.9
# Weight of the newest batch in the background share of compute time.
SHARE_ALPHA = 0.05
# Online traffic is present (background work paced) while at least this many online rows
# arrived within about one ARRIVAL_TAU_NS (decayed count).
ONLINE_PRESENT_ROWS = 1.0
# Time constant of a stream's measured arrival rate.
ARRIVAL_TAU_NS = 200 * NS_PER_MS
# A batch keeps waiting only while at least this many more rows are expected meanwhile.
ROWS_WORTH_WAITING = 1.0
# Online entries read after waiting longer than this in their queue pause background work.
DEFAULT_BACKGROUND_TARGET_WAIT_MS = 2.0
# A level counts as having traffic (lower levels' batches are cut) this long after a row
# of it was last read.
HIGHER_PRESENT_NS = 2_000 * NS_PER_MS


@dataclass(frozen=True, slots=True)
class StreamView:
    """What the worker knows about one stream's buffered (read, not yet computed) entries.
    All times on the caller's clock, in ns."""

    key: StreamKey
    rows: int  # rows buffered (sum of the requests' batch dims); a view with none is ignored
    oldest_enqueued_ns: int  # routed time of the oldest buffered entry (aging)
    first_dequeued_ns: int  # when the oldest buffered entry was read (the batch wait)
    earliest_deadline_ns: int  # earliest absolute deadline among the entries; 0 = none
    size: int = 0  # bytes buffered (the entries' jobs as read)


@dataclass(slots=True)
class _CostFit:
    """EWMA moments of (rows, compute ns) for one (unit, bucket)."""

    rows: float
    ns: float
    rows_sq: float
    rows_ns: float

    def update(self, rows: int, ns: int) -> None:
        a = EWMA_ALPHA
        self.rows += a * (rows - self.rows)
        self.ns += a * (ns - self.ns)
        self.rows_sq += a * (rows * rows - self.rows_sq)
        self.rows_ns += a * (rows * ns - self.rows_ns)

    def estimate(self, rows: int) -> float:
        no_fixed_slope = self.ns / self.rows
        variance = self.rows_sq - self.rows * self.rows
        if variance <= _MIN_ROWS_VARIANCE:
            slope = no_fixed_slope if rows > self.rows else 0.0
        else:
            covariance = self.rows_ns - self.rows * self.ns
            slope = min(max(covariance / variance, 0.0), no_fixed_slope)
        return self.ns + slope * (rows - self.rows)


@dataclass(slots=True)
class _Arrivals:
    """Rows arrived on one stream, decayed with time constant ARRIVAL_TAU_NS."""

    rows: float
    at_ns: int

    def decayed(self, now_ns: int) -> float:
        return self.rows * math.exp(-max(now_ns - self.at_ns, 0) / ARRIVAL_TAU_NS)

    def add(self, rows: int, now_ns: int) -> None:
        self.rows = self.decayed(now_ns) + rows
        self.at_ns = max(self.at_ns, now_ns)

    def expected(self, now_ns: int, within_ns: int) -> float:
        """Rows expected to arrive within the next `within_ns` at the measured rate."""
        return self.decayed(now_ns) / ARRIVAL_TAU_NS * within_ns


class Scheduler:
    """The worker's scheduling decisions for the compute units in `configs` (keyed like
    ``StreamKey.model``). One per worker; not thread-safe (the loop owns it)."""

    def __init__(
        self,
        configs: Mapping[ComputeUnit, ModelConfig],
        background_share: float = 0.0,
        max_batch_bytes: int = 0,
        *,
        lanes: int = 1,
        background_target_wait_ms: float = DEFAULT_BACKGROUND_TARGET_WAIT_MS,
    ) -> None:
        # max_batch_bytes: a batch's budget in bytes (0: none); the intake takes within it,
        # and a stream holding that much buffered closes its batch at once. lanes: the
        # worker's compute lanes (background work leaves one to online traffic).
        # background_target_wait_ms: the online queue wait above which it pauses.
        if lanes < 1 or background_target_wait_ms < 0:
            raise ValueError(
                f"lanes must be >= 1 and background_target_wait_ms >= 0, "
                f"got {lanes}, {background_target_wait_ms}"
            )
        self._configs = dict(configs)
        self.max_batch_bytes = max_batch_bytes
        self._background_share = background_share
        # Background batches picked and not yet done.
        self._bg_in_flight = 0
        self._lanes = lanes
        self._bg_target_wait_ns = round(background_target_wait_ms * NS_PER_MS)
        # The longest queue wait among the online entries of the latest read that had any.
        self._online_wait_ns = 0
        # EWMAs of compute ns per batch: background batches only, and all batches.
        self._bg_ns = 0.0
        self._all_ns = 0.0
        # (unit, level) -> smooth weighted round-robin credit; sums to zero.
        self._credits: dict[tuple[ComputeUnit, int], float] = defaultdict(float)
        # (unit, online level) -> when a row of it was last read (row_cap).
        self._last_read: dict[tuple[ComputeUnit, int], int] = {}
        # (unit, bucket, background) -> cost fit: batch jobs' batches compute on idle
        # threads (worker/lanes.py), so their times say nothing of an online batch's.
        self._costs: dict[tuple[ComputeUnit, int, bool], _CostFit] = {}
        self._last_pick_aged = False
        self._arrivals: dict[StreamKey, _Arrivals] = {}

    def set_units(self, configs: Mapping[ComputeUnit, ModelConfig]) -> None:
        """The units served from now on (model control opened or closed some). Credits and
        cost fits are kept: a unit loaded again resumes where it was."""
        self._configs = dict(configs)

    def pick(self, views: Sequence[StreamView], now_ns: int) -> StreamKey | None:
        """The stream to form the next batch from, or None when no view has rows. Called
        once per batch: a weighted pick charges the winning level's credit."""
        live = [v for v in views if v.rows > 0 and not is_background(v.key)]
        background = [v for v in views if v.rows > 0 and is_background(v.key)]
        if background and (
            (not live and self.background_wait_ms(now_ns) <= 0)
            or (live and self.background_time_share < self._background_share)
        ):
            return min(background, key=lambda v: (v.key.bucket, v.key.unit, v.key.tier)).key
        if not live:
            return None
        overdue = [(excess, v) for v in live if (excess := self._overdue_ns(v, now_ns)) > 0]
        if overdue and (not self._last_pick_aged or len(overdue) == len(live)):
            self._last_pick_aged = True
            _, view = min(overdue, key=lambda ev: (-ev[0], *_order(ev[1].key)))
            return view.key
        self._last_pick_aged = False
        groups: dict[tuple[ComputeUnit, int], list[StreamView]] = defaultdict(list)
        for v in live:
            groups[(v.key.unit, v.key.priority)].append(v)
        weights = {g: self._config(g[0]).scheduling.weight(g[1]) for g in groups}
        self._forget_absent(groups.keys())
        for group, weight in weights.items():
            self._credits[group] += weight
        winner = min(groups, key=lambda g: (-self._credits[g], g[1], g[0]))
        self._credits[winner] -= sum(weights.values())
        chosen = min(
            groups[winner],
            key=lambda v: (self._remaining_wait_ns(v, now_ns), v.key.bucket, v.key.tier),
        )
        return chosen.key

    def _forget_absent(self, present: Collection[tuple[ComputeUnit, int]]) -> None:
        """Groups without work forget their credit; the present ones share it (sum zero)."""
        absent = [g for g in self._credits if g not in present]
        if not absent:
            return
        held = sum(self._credits.pop(g) for g in absent)
        share = held / len(present)
        for group in present:
            self._credits[group] += share

    def wait_ms(self, view: StreamView, now_ns: int) -> float:
        """How much longer to keep filling this stream's batch; <= 0 means close it now.
        Called for the picked stream, again whenever more entries arrive or time passes."""
        if is_background(view.key):
            return 0.0
        spec = self._config(view.key.unit).bucket(view.key.bucket)
        if view.rows >= min(spec.max_batch_size, self.row_cap(view.key, now_ns)):
            return 0.0
        if self.max_batch_bytes and view.size >= self.max_batch_bytes:
            return 0.0
        if spec.preferred_batch_sizes and view.rows >= max(spec.preferred_batch_sizes):
            return 0.0
        if self._overdue_ns(view, now_ns) > 0:
            return 0.0
        remaining_ns = self._remaining_wait_ns(view, now_ns)
        if remaining_ns <= 0:
            return 0.0
        arrivals = self._arrivals.get(view.key)
        if (
            arrivals is not None
            and self._config(view.key.unit).adaptive_wait
            and arrivals.expected(now_ns, remaining_ns) < ROWS_WORTH_WAITING
        ):
            return 0.0
        if view.earliest_deadline_ns:
            compute_ns = self.compute_estimate_ns(view.key, self.batch_rows(view, now_ns))
            if now_ns + remaining_ns + compute_ns > view.earliest_deadline_ns:
                return 0.0
        return remaining_ns / NS_PER_MS

    def arrived(self, key: StreamKey, rows: int, now_ns: int) -> None:
        """Record rows read from a stream (its arrival rate, for the adaptive batch wait)."""
        slot = self._arrivals.get(key)
        if slot is None:
            self._arrivals[key] = _Arrivals(float(rows), now_ns)
        else:
            slot.add(rows, now_ns)
        if rows > 0 and not is_background(key):
            level = (key.unit, key.priority)
            self._last_read[level] = max(self._last_read.get(level, now_ns), now_ns)

    def batch_rows(self, view: StreamView, now_ns: int) -> int:
        """How many rows the batch closed now should take: never more than the bucket's
        max_batch_size, nor the cut while a higher level has traffic (`row_cap`); the
        largest preferred size that fits when preferred sizes exist and one does, else
        every row up to that maximum."""
        if is_background(view.key):
            rows = min(view.rows, self.background_rows(view.key))
            if self._lanes == 1 and self.online_present(now_ns):
                return min(rows, self._yield_rows(view.key))
            return rows
        spec = self._config(view.key.unit).bucket(view.key.bucket)
        cap = min(view.rows, spec.max_batch_size, self.row_cap(view.key, now_ns))
        fitting = [p for p in spec.preferred_batch_sizes if p <= cap]
        return max(fitting) if fitting else cap

    def row_cap(self, key: StreamKey, now_ns: int) -> int:
        """The most rows a batch of this online stream may take now: the bucket's
        max_batch_size, or while a higher level of its unit has had traffic within
        HIGHER_PRESENT_NS, the most rows estimated to compute within the model's
        ``scheduling.yield_ms`` (at least 1). Uncut before the bucket's cost is measured."""
        if not self._higher_present(key, now_ns):
            return self._config(key.unit).bucket(key.bucket).max_batch_size
        return self._yield_rows(key)

    def _yield_rows(self, key: StreamKey) -> int:
        """The most rows of this (unit, bucket) estimated to compute within the model's
        ``scheduling.yield_ms`` (at least 1); the bucket's max_batch_size before its cost
        is measured, or with yield_ms 0."""
        spec = self._config(key.unit).bucket(key.bucket)
        yield_ns = self._config(key.unit).scheduling.yield_ms * NS_PER_MS
        fit = self._costs.get(_cost_slot(key))
        if fit is None or yield_ns <= 0:
            return spec.max_batch_size
        rows = 1
        while rows < spec.max_batch_size and fit.estimate(rows + 1) <= yield_ns:
            rows += 1
        return rows

    def _higher_present(self, key: StreamKey, now_ns: int) -> bool:
        return any(
            unit == key.unit and level < key.priority and now_ns - at <= HIGHER_PRESENT_NS
            for (unit, level), at in self._last_read.items()
        )

    def observe(self, key: StreamKey, rows: int, compute_ns: int, inline: bool = False) -> None:
        """Record how long a batch of `rows` rows of this (unit, bucket) took to compute.
        Called after each batch; tier and online priority of `key` do not matter, batch-job
        batches have a fit of their own. A batch computed `inline` counts in the background
        share, not in the compute estimate."""
        if rows < 1 or compute_ns < 0:
            raise ValueError(
                f"observe needs rows >= 1 and compute_ns >= 0, got {rows}, {compute_ns}"
            )
        bg_ns = compute_ns if is_background(key) else 0
        self._bg_ns += SHARE_ALPHA * (bg_ns - self._bg_ns)
        self._all_ns += SHARE_ALPHA * (compute_ns - self._all_ns)
        if inline:
            return
        slot = _cost_slot(key)
        fit = self._costs.get(slot)
        if fit is None:
            self._costs[slot] = _CostFit(rows, compute_ns, rows * rows, rows * compute_ns)
        else:
            fit.update(rows, compute_ns)

    def online_present(self, now_ns: int) -> bool:
        """Whether online rows keep arriving (recently enough to pace background work)."""
        rows = sum(a.decayed(now_ns) for k, a in self._arrivals.items() if not is_background(k))
        return rows >= ONLINE_PRESENT_ROWS

    def online_waited(self, wait_ns: int) -> None:
        """Record the longest queue wait (enqueued -> read by this worker) among the online
        entries of one read; called for every read that brought online entries. The latest
        decides whether background work pauses (`background_wait_ms`)."""
        self._online_wait_ns = max(0, wait_ns)

    def background_wait_ms(self, now_ns: int) -> float:
        """How long background work must still wait before its next batch (0: it may go
        now; inf: until a batch in flight is done, or an online read waited within the
        target). Always 0 without online traffic."""
        if not self.online_present(now_ns):
            return 0.0
        if self._online_wait_ns > self._bg_target_wait_ns:
            return math.inf
        # At most one lane fewer than the worker has (one, on a one-lane worker).
        if self._bg_in_flight >= max(1, self._lanes - 1):
            return math.inf
        return 0.0

    def background_started(self) -> None:
        """A background batch was picked (its rows go to compute)."""
        self._bg_in_flight += 1

    def background_done(self) -> None:
        """A background batch picked is done (results written, or given up)."""
        self._bg_in_flight = max(0, self._bg_in_flight - 1)

    @property
    def background_time_share(self) -> float:
        """The recent share of compute time background batches took (EWMA), 0..1."""
        return self._bg_ns / self._all_ns if self._all_ns > 0 else 0.0

    def background_rows(self, key: StreamKey) -> int:
        """The throughput-optimal batch of this (unit, bucket) for background work: see the
        module docstring. The bucket's max_batch_size until a cost fit with a slope exists."""
        cap = self._config(key.unit).bucket(key.bucket).max_batch_size
        fit = self._costs.get(_cost_slot(key))
        if fit is None:
            return cap
        fixed = fit.estimate(0)
        per_row = fit.estimate(1) - fixed
        if per_row <= 0:
            return cap  # all fixed cost: the bigger the better
        best = math.ceil(max(fixed, 0.0) / per_row * BG_EFFICIENCY / (1 - BG_EFFICIENCY))
        return max(1, min(cap, best))

    def compute_estimate_ns(self, key: StreamKey, rows: int) -> int:
        """Expected compute time of a batch of `rows` rows of this (unit, bucket), rounded
        up; 0 before any batch of it was observed or for no rows."""
        fit = self._costs.get(_cost_slot(key))
        if fit is None or rows < 1:
            return 0
        return max(0, math.ceil(fit.estimate(rows)))

    def _config(self, unit: ComputeUnit) -> ModelConfig:
        try:
            return self._configs[unit]
        except KeyError:
            raise KeyError(f"no model config for compute unit {unit!r}") from None

    def _overdue_ns(self, view: StreamView, now_ns: int) -> int:
        """How far the oldest entry is past its level's age limit (> 0: overdue)."""
        limit_ms = self._config(view.key.unit).scheduling.age_limit(view.key.priority)
        return (now_ns - view.oldest_enqueued_ns) - round(limit_ms * NS_PER_MS)

    def _remaining_wait_ns(self, view: StreamView, now_ns: int) -> int:
        spec = self._config(view.key.unit).bucket(view.key.bucket)
        return round(spec.max_batch_wait_ms * NS_PER_MS) - (now_ns - view.first_dequeued_ns)


def is_background(key: StreamKey) -> bool:
    """Whether a stream carries batch-job work (below every online level)."""
    return key.priority == BACKGROUND_PRIORITY


def _cost_slot(key: StreamKey) -> tuple[ComputeUnit, int, bool]:
    """Whose cost fit a batch of this stream feeds and reads: (unit, bucket, background)."""
    return (key.unit, key.bucket, is_background(key))


def _order(key: StreamKey) -> tuple[int, int, ComputeUnit, str]:
    """Tie-break between streams: higher priority, lower bucket, then names."""
    return (key.priority, key.bucket, key.unit, key.tier)
