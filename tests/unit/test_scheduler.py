"""The worker's scheduling decisions: weighted priority with aging, bucket choice, batch
close and size, compute estimates. The clock is a plain integer throughout."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.model_config import ModelConfig, RepositoryError, parse_config
from tiermesh.worker.scheduler import HIGHER_PRESENT_NS, Scheduler, StreamView

MS = 1_000_000
# A wall-clock-sized origin: float arithmetic on ns timestamps this large loses precision.
T0 = 1_700_000_000_000_000_000
UNIT = ComputeUnit.parse("minilm@1.fp32")
TIER = "center"
# Bucket 0: short sequences, big batches, short wait, preferred sizes; 2: long, small, long.
BUCKETS: list[dict[str, Any]] = [
    {"max_length": 16, "max_batch_size": 32, "max_batch_wait_ms": 2, "preferred": [8, 16]},
    {"max_length": 64, "max_batch_size": 16, "max_batch_wait_ms": 5},
    {"max_length": 256, "max_batch_size": 4, "max_batch_wait_ms": 10},
]
AGE_LIMITS = (1000.0, 100.0)


def _cfg(weights: Sequence[int] = (4, 1), ages: Sequence[float] = AGE_LIMITS) -> ModelConfig:
    return parse_config(_raw(weights, ages), "test")


def _raw(weights: Sequence[int] = (4, 1), ages: Sequence[float] = AGE_LIMITS) -> dict[str, Any]:
    return {
        "name": "minilm",
        "max_batch_size": 32,
        "inputs": [{"name": "IDS", "datatype": "INT64", "dims": [-1]}],
        "outputs": [{"name": "EMB", "datatype": "FP32", "dims": [8]}],
        "versions": {"1": {"model.onnx": "0" * 64}},
        "priority_levels": 2,
        "length_buckets": [
            {
                "max_length": b["max_length"],
                "max_batch_size": b["max_batch_size"],
                "max_batch_wait_ms": b["max_batch_wait_ms"],
                "preferred_batch_sizes": b.get("preferred", []),
            }
            for b in BUCKETS
        ],
        "scheduling": {"priority_weights": list(weights), "age_limit_ms": list(ages)},
    }


def _sched(weights: Sequence[int] = (4, 1), ages: Sequence[float] = AGE_LIMITS) -> Scheduler:
    return Scheduler({UNIT: _cfg(weights, ages)})


def _key(priority: int = 1, bucket: int = 0, unit: ComputeUnit = UNIT) -> StreamKey:
    return StreamKey(unit, TIER, priority, bucket)


def _view(
    priority: int = 1,
    bucket: int = 0,
    rows: int = 1,
    *,
    now: int = T0,
    waited_ms: float = 0.0,
    aged_ms: float | None = None,
    deadline_ns: int = 0,
    unit: ComputeUnit = UNIT,
) -> StreamView:
    """A view at `now`: read `waited_ms` ago, routed `aged_ms` ago (default: when read)."""
    aged = waited_ms if aged_ms is None else aged_ms
    return StreamView(
        key=_key(priority, bucket, unit),
        rows=rows,
        oldest_enqueued_ns=now - round(aged * MS),
        first_dequeued_ns=now - round(waited_ms * MS),
        earliest_deadline_ns=deadline_ns,
    )


# -- pick: priority and weights ------------------------------------------------------------


def test_pick_returns_none_without_views() -> None:
    assert _sched().pick([], T0) is None


def test_pick_ignores_views_without_rows() -> None:
    s = _sched()
    assert s.pick([_view(rows=0)], T0) is None
    assert s.pick([_view(1, rows=0), _view(2, rows=3)], T0) == _key(2)


@pytest.mark.parametrize(
    ("weights", "first"),
    [((4, 1), 1), ((1, 1), 1), ((100, 1), 1), ((1, 4), 2)],  # (1, 1): ties go to level 1
)
def test_first_pick_follows_weights_then_priority(weights: tuple[int, int], first: int) -> None:
    key = _sched(weights).pick([_view(2, rows=5), _view(1, rows=5)], T0)
    assert key == _key(first)


@pytest.mark.parametrize(
    ("weights", "level1", "longest_level1_run"),
    [((4, 1), 40, 4), ((1, 1), 25, 1), ((3, 2), 30, 2), ((9, 1), 45, 9)],
)
def test_weighted_share_over_50_picks(
    weights: tuple[int, int], level1: int, longest_level1_run: int
) -> None:
    s = _sched(weights)
    views = [_view(1, rows=32), _view(2, rows=32)]
    picks = [s.pick(views, T0 + i * MS) for i in range(50)]
    counts = Counter(k.priority for k in picks if k is not None)
    assert counts == {1: level1, 2: 50 - level1}
    # Smooth: level 2 is never kept waiting for more than its weight ratio implies.
    runs = "".join(str(k.priority) for k in picks if k is not None).split("2")
    assert max(len(r) for r in runs) == longest_level1_run


def test_intermittent_level_keeps_its_share() -> None:
    """Level 2 turns up with one batch, is served, goes idle, returns: each time it must be
    served within one weight cycle, not later and later (level 1 must not bank credit
    while it runs alone)."""
    s = _sched((4, 1))
    flood = _view(1, rows=32)
    now = T0
    for _ in range(50):
        for _ in range(7):  # level 1 alone for a while
            assert s.pick([flood], now) == flood.key
            now += MS
        picks_until_served = 0
        while True:
            picks_until_served += 1
            key = s.pick([flood, _view(2, now=now)], now)
            now += MS
            if key == _key(2):
                break
        assert picks_until_served <= 3  # from even: 4 against 1 wins twice, then level 2


@pytest.mark.parametrize("flood_batches_between", [1, 3, 7])
def test_a_level_one_trickle_is_taken_at_the_next_boundary(flood_batches_between: int) -> None:
    """Level 1 turns up with one request at a time beside a level-2 flood: every time, the
    next pick is its (kept credit would be the trickle's debt from its last win, and one in
    five returns would wait another batch)."""
    s = _sched((4, 1))
    now = T0
    for _ in range(100):
        assert s.pick([_view(2, rows=32, now=now), _view(1, now=now)], now) == _key(1)
        now += MS
        for _ in range(flood_batches_between):
            assert s.pick([_view(2, rows=32, now=now)], now) == _key(2)
            now += MS


def test_forgotten_credit_is_shared_so_credits_sum_to_zero() -> None:
    other = ComputeUnit.parse("mlp@1.fp32")
    s = Scheduler({UNIT: _cfg((4, 1)), other: _cfg((4, 1))})
    views = [_view(2, rows=8), _view(2, rows=8, unit=other)]
    now = T0
    for i in range(30):
        trickle = [_view(1, now=now)] if i % 3 == 0 else []
        s.pick([*views, *trickle], now)
        assert sum(s._credits.values()) == pytest.approx(0.0, abs=1e-9)
        now += MS
    # The two flooded units still alternate.
    picks = Counter(s.pick(views, now + i * MS) for i in range(20))
    assert picks == {_key(2): 10, _key(2, unit=other): 10}


def test_levels_of_different_units_share_by_weight() -> None:
    other = ComputeUnit.parse("mlp@1.fp32")
    s = Scheduler({UNIT: _cfg((4, 1)), other: _cfg((4, 1))})
    views = [_view(1, rows=8), _view(1, rows=8, unit=other)]
    picks = Counter(s.pick(views, T0 + i * MS) for i in range(20))
    assert picks == {_key(1): 10, _key(1, unit=other): 10}


def test_unknown_unit_raises() -> None:
    with pytest.raises(KeyError, match=r"bert@1\.fp32"):
        _sched().pick([_view(unit=ComputeUnit.parse("bert@1.fp32"))], T0)


# -- pick: aging ---------------------------------------------------------------------------


@pytest.mark.parametrize("weights", [(4, 1), (1000, 1)])
def test_overdue_level_two_beats_level_one(weights: tuple[int, int]) -> None:
    s = _sched(weights)
    over = _view(2, aged_ms=AGE_LIMITS[1] + 0.001)
    assert s.pick([_view(1, rows=32, aged_ms=999.0), over], T0) == over.key


def test_exactly_at_age_limit_is_not_overdue() -> None:
    s = _sched((1000, 1))
    at_limit = _view(2, aged_ms=AGE_LIMITS[1])
    assert s.pick([_view(1, rows=32), at_limit], T0) == _key(1)


@pytest.mark.parametrize(
    ("aged", "winner"),
    [
        # (level-1 age, level-2 age) in ms; limits 1000 and 100
        ((1050.0, 120.0), 1),  # excess 50 vs 20
        ((1010.0, 150.0), 2),  # excess 10 vs 50
        ((1030.0, 130.0), 1),  # equal excess: higher priority
    ],
)
def test_most_overdue_first(aged: tuple[float, float], winner: int) -> None:
    views = [_view(1, aged_ms=aged[0]), _view(2, aged_ms=aged[1])]
    assert _sched((1, 1000)).pick(views, T0) == _key(winner)


def test_aging_pick_does_not_spend_credits() -> None:
    plain, aged = _sched(), _sched()
    assert aged.pick([_view(1), _view(2, aged_ms=500.0)], T0) == _key(2)
    views = [_view(1), _view(2)]
    assert [plain.pick(views, T0) for _ in range(10)] == [aged.pick(views, T0) for _ in range(10)]


@pytest.mark.parametrize("weights", [(4, 1), (1000, 1)])
@pytest.mark.parametrize("phase_ns", [0, 3 * MS, 7 * MS - 1])
def test_aging_bound_under_level_one_flood(weights: tuple[int, int], phase_ns: int) -> None:
    """A simulated worker: level-1 work always waits (fresh, full batches), one level-2
    request is routed at `enqueued`, each batch computes for B ms. The level-2 request must
    start computing within its age limit plus one batch duration."""
    batch_ns = 7 * MS
    limit_ns = round(AGE_LIMITS[1] * MS)
    s = _sched(weights)
    now = T0
    enqueued = T0 + 20 * batch_ns + phase_ns
    dequeued: int | None = None
    served_at: int | None = None
    for _ in range(10_000):
        views = [_view(1, bucket=0, rows=32, now=now, aged_ms=1.0)]
        if now >= enqueued:
            dequeued = now if dequeued is None else dequeued
            views.append(StreamView(_key(2, 1), 1, enqueued, dequeued, 0))
        key = s.pick(views, now)
        assert key is not None
        if key.priority == 2:
            assert s.wait_ms(views[1], now) <= 0  # it closes at once, not after a wait
            served_at = now
            break
        assert s.wait_ms(views[0], now) <= 0  # a full batch
        now += batch_ns
    assert served_at is not None
    assert served_at - enqueued <= limit_ns + batch_ns
    if weights == (1000, 1):
        assert served_at - enqueued > limit_ns  # weights alone would take ~500 batches


# -- pick: buckets -------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 5, 17, 40, 1000])
def test_buckets_never_merge(rows: int) -> None:
    s = _sched()
    views = [_view(1, b, rows, waited_ms=1.0) for b in range(3)]
    key = s.pick(views, T0)
    assert key in {v.key for v in views}
    for v in views:
        assert s.batch_rows(v, T0) <= BUCKETS[v.key.bucket]["max_batch_size"]
        assert s.batch_rows(v, T0) <= rows


@pytest.mark.parametrize(
    ("short_waited", "long_waited", "winner"),
    [
        (1.5, 8.0, 0),  # short 0.5 ms from its limit, long 2 ms: the long one is older
        (0.0, 9.0, 2),  # long 1 ms from its limit, short 2 ms
        (1.0, 9.0, 0),  # equal (1 ms each): lower bucket
        (3.0, 20.0, 2),  # both past: the long one further past
    ],
)
def test_bucket_nearest_its_wait_limit_first(
    short_waited: float, long_waited: float, winner: int
) -> None:
    views = [_view(1, 2, 3, waited_ms=long_waited), _view(1, 0, 3, waited_ms=short_waited)]
    assert _sched().pick(views, T0) == _key(1, winner)


# -- wait_ms: batch close ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bucket", "rows", "waited_ms", "expected"),
    [
        (1, 16, 0.0, 0.0),  # full: max_batch_size
        (1, 40, 0.0, 0.0),  # over full
        (2, 4, 0.0, 0.0),
        (0, 16, 0.0, 0.0),  # the largest preferred size
        (0, 20, 0.0, 0.0),
        (0, 8, 0.0, 2.0),  # a smaller preferred size alone does not close
        (0, 15, 0.5, 1.5),
        (1, 3, 1.0, 4.0),
        (2, 1, 9.75, 0.25),
        (1, 3, 5.0, 0.0),  # the wait is over
        (1, 3, 7.0, 0.0),
    ],
)
def test_wait_ms_close_conditions(
    bucket: int, rows: int, waited_ms: float, expected: float
) -> None:
    got = _sched().wait_ms(_view(1, bucket, rows, waited_ms=waited_ms), T0)
    if expected == 0.0:
        assert got <= 0
    else:
        assert got == pytest.approx(expected)


def _arrivals(sched: Scheduler, key: StreamKey, every_ms: float, n: int, end: int) -> None:
    """`n` single-row arrivals on `key`, `every_ms` apart, the last at `end`."""
    for i in range(n):
        sched.arrived(key, 1, end - round((n - 1 - i) * every_ms * MS))


@pytest.mark.parametrize(
    ("every_ms", "waits"),
    [
        (14.0, False),  # one client waiting for each answer: ~70/s, 0.35 rows per 5 ms
        (1000.0, False),  # a trickle
        (2.0, True),  # 500/s: 2.5 rows expected in the 5 ms wait
        (0.1, True),
    ],
)
def test_adaptive_wait_follows_the_arrival_rate(every_ms: float, waits: bool) -> None:
    sched = _sched()
    _arrivals(sched, _key(1, 1), every_ms, 200, T0)
    got = sched.wait_ms(_view(1, 1, 1), T0)
    assert (got > 0) is waits
    if waits:
        assert got == pytest.approx(5.0)  # the whole remaining wait, as before


def test_adaptive_wait_closes_once_too_little_is_left_to_wait_for() -> None:
    """At 1 row per ms a 5 ms wait is worth it at first, not in its last ms."""
    sched = _sched()
    _arrivals(sched, _key(1, 1), 1.0, 1000, T0)
    assert sched.wait_ms(_view(1, 1, 1, waited_ms=1.0), T0) > 0
    assert sched.wait_ms(_view(1, 1, 1, waited_ms=4.5), T0) <= 0


def test_adaptive_wait_forgets_a_past_burst() -> None:
    sched = _sched()
    _arrivals(sched, _key(1, 1), 0.1, 1000, T0)
    assert sched.wait_ms(_view(1, 1, 1), T0) > 0
    later = T0 + 2000 * MS  # two seconds of silence (10 time constants)
    assert sched.wait_ms(_view(1, 1, 1, now=later), later) <= 0


def test_adaptive_wait_is_per_stream_and_needs_a_record() -> None:
    sched = _sched()
    _arrivals(sched, _key(1, 1), 14.0, 200, T0)
    assert sched.wait_ms(_view(1, 1, 1), T0) <= 0
    # Nothing recorded for this stream: the whole wait, as configured.
    assert sched.wait_ms(_view(2, 1, 1), T0) == pytest.approx(5.0)


def test_adaptive_wait_off_waits_the_whole_wait() -> None:
    cfg = dataclasses.replace(_cfg(), adaptive_wait=False)
    sched = Scheduler({UNIT: cfg})
    _arrivals(sched, _key(1, 1), 1000.0, 10, T0)
    assert sched.wait_ms(_view(1, 1, 1), T0) == pytest.approx(5.0)


def test_adaptive_wait_parses_from_the_batching_section() -> None:
    assert _cfg().adaptive_wait is True
    raw = {**_raw(), "batching": {"max_batch_wait_ms": 2, "adaptive_wait": False}}
    assert parse_config(raw, "test").adaptive_wait is False
    with pytest.raises(
        RepositoryError, match=r"batching\.adaptive_wait: Input should be a valid boolean"
    ):
        parse_config({**_raw(), "batching": {"adaptive_wait": "no"}}, "test")


def test_overdue_view_closes_at_once() -> None:
    view = _view(2, 2, 1, waited_ms=0.0, aged_ms=AGE_LIMITS[1] + 1)
    assert _sched().wait_ms(view, T0) <= 0


@pytest.mark.parametrize(
    ("observed_ms", "deadline_in_ms", "closes"),
    [
        (20.0, 25.0, True),  # 10 ms wait + 20 ms compute > 25 ms: close now
        (20.0, 30.0, False),  # exactly meets it
        (20.0, 40.0, False),
        (None, 25.0, False),  # nothing observed: the wait alone fits
        (None, 9.0, True),  # the wait alone misses it
        (5.0, 14.0, True),
    ],
)
def test_deadline_closes_early(
    observed_ms: float | None, deadline_in_ms: float, closes: bool
) -> None:
    s = _sched()
    key = _key(1, 2)
    if observed_ms is not None:
        for _ in range(3):
            s.observe(key, 2, round(observed_ms * MS))
    view = _view(1, 2, 2, deadline_ns=T0 + round(deadline_in_ms * MS))
    got = s.wait_ms(view, T0)
    if closes:
        assert got <= 0
    else:
        assert got == pytest.approx(10.0)


# -- batch_rows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bucket", "rows", "expected"),
    [
        (0, 1, 1),  # below every preferred size: all of them
        (0, 7, 7),
        (0, 8, 8),
        (0, 12, 8),  # the largest preferred size that fits
        (0, 16, 16),
        (0, 31, 16),
        (0, 100, 16),
        (1, 3, 3),  # no preferred sizes: all up to the maximum
        (1, 16, 16),
        (1, 17, 16),
        (2, 9, 4),
    ],
)
def test_batch_rows(bucket: int, rows: int, expected: int) -> None:
    assert _sched().batch_rows(_view(1, bucket, rows), T0) == expected


# -- row_cap: lower levels yield to a higher one ---------------------------------------------


def _measured(
    s: Scheduler, bucket: int = 1, fixed_ms: float = 1.0, per_row_ms: float = 2.0
) -> None:
    """Batches of 1..8 rows observed: fixed + per_row * rows."""
    for rows in [1, 2, 4, 8, 3, 6] * 3:
        s.observe(_key(2, bucket), rows, round((fixed_ms + per_row_ms * rows) * MS))


def test_no_cut_without_higher_level_traffic() -> None:
    s = _sched()
    _measured(s)
    assert s.row_cap(_key(2, 1), T0) == 16
    assert s.batch_rows(_view(2, 1, rows=16), T0) == 16
    s.arrived(_key(2, 1), 5, T0)  # its own level's traffic does not count
    assert s.row_cap(_key(2, 1), T0) == 16


def test_a_lower_level_is_cut_to_the_yield_while_a_higher_one_has_traffic() -> None:
    s = _sched()  # yield_ms 10 by default
    _measured(s)  # 1 ms + 2 ms per row: 4 rows take 9 ms, 5 take 11
    s.arrived(_key(1, 0), 1, T0)  # a level-1 row, in another bucket
    assert s.row_cap(_key(2, 1), T0) == 4
    assert s.batch_rows(_view(2, 1, rows=16), T0) == 4
    # A batch at its cut closes at once.
    assert s.wait_ms(_view(2, 1, rows=4), T0) == 0.0
    assert s.wait_ms(_view(2, 1, rows=3), T0) > 0
    # Level 1 itself is never cut.
    _measured(s, bucket=0)
    assert s.row_cap(_key(1, 0), T0) == 32
    # The cut lasts while the higher level's last row is recent.
    assert s.row_cap(_key(2, 1), T0 + HIGHER_PRESENT_NS) == 4
    assert s.row_cap(_key(2, 1), T0 + HIGHER_PRESENT_NS + 1) == 16


def test_the_cut_keeps_at_least_one_row_and_needs_a_measured_cost() -> None:
    s = _sched()
    s.arrived(_key(1, 0), 1, T0)
    assert s.row_cap(_key(2, 1), T0) == 16  # nothing measured for the bucket yet
    _measured(s, fixed_ms=30.0)  # one row alone takes longer than the yield
    assert s.row_cap(_key(2, 1), T0) == 1


def test_yield_zero_never_cuts() -> None:
    raw = _raw()
    raw["scheduling"]["yield_ms"] = 0
    s = Scheduler({UNIT: parse_config(raw, "test")})
    _measured(s)
    s.arrived(_key(1, 0), 1, T0)
    assert s.row_cap(_key(2, 1), T0) == 16


@pytest.mark.parametrize("bad", [-1, "soon", float("inf")])
def test_yield_ms_must_be_a_finite_non_negative_number(bad: object) -> None:
    raw = _raw()
    raw["scheduling"]["yield_ms"] = bad
    with pytest.raises(RepositoryError, match=r"yield_ms|could not convert"):
        parse_config(raw, "test")


# -- observe / compute_estimate_ns ---------------------------------------------------------


def test_estimate_is_zero_before_observing() -> None:
    assert _sched().compute_estimate_ns(_key(), 8) == 0


def test_single_batch_size_estimates_conservatively() -> None:
    s = _sched()
    s.observe(_key(), 8, 16 * MS)
    assert s.compute_estimate_ns(_key(), 8) == 16 * MS
    assert s.compute_estimate_ns(_key(), 4) == 16 * MS  # maybe all fixed cost
    assert s.compute_estimate_ns(_key(), 16) == 32 * MS  # maybe all per row


def test_fit_recovers_fixed_and_per_row_cost() -> None:
    s = _sched()
    for rows in [1, 4, 8, 16, 32, 2, 24] * 3:
        s.observe(_key(), rows, 1 * MS + rows * MS // 2)  # 1 ms + 0.5 ms per row
    for rows in (1, 10, 32):
        assert s.compute_estimate_ns(_key(), rows) == pytest.approx(MS + rows * MS / 2, rel=1e-6)


def test_estimate_follows_a_change_gradually() -> None:
    s = _sched()
    s.observe(_key(), 8, 10 * MS)
    s.observe(_key(), 8, 20 * MS)
    mid = s.compute_estimate_ns(_key(), 8)
    assert 10 * MS < mid < 20 * MS
    for _ in range(60):
        s.observe(_key(), 8, 20 * MS)
    assert s.compute_estimate_ns(_key(), 8) == pytest.approx(20 * MS, rel=1e-3)


def test_estimates_are_per_unit_and_bucket_not_per_tier_or_priority() -> None:
    s = Scheduler({UNIT: _cfg(), ComputeUnit.parse("mlp@1.fp32"): _cfg()})
    s.observe(StreamKey(UNIT, "edge", 2, 1), 4, 8 * MS)
    assert s.compute_estimate_ns(StreamKey(UNIT, TIER, 1, 1), 4) == 8 * MS
    assert s.compute_estimate_ns(_key(1, 0), 4) == 0
    assert s.compute_estimate_ns(_key(1, 1, ComputeUnit.parse("mlp@1.fp32")), 4) == 0


def test_a_batch_computed_inline_leaves_the_estimate_as_it_was() -> None:
    """The estimate is a lane's: a faster batch on the loop's own thread does not lower it
    (it decides what runs inline; lowered by inline batches the choice would keep itself)."""
    s = _sched()
    s.observe(_key(), 1, 3 * MS)
    for _ in range(20):
        s.observe(_key(), 1, 1 * MS, inline=True)
    assert s.compute_estimate_ns(_key(), 1) == 3 * MS
    s.observe(_key(), 1, 1 * MS)
    assert s.compute_estimate_ns(_key(), 1) < 3 * MS


@pytest.mark.parametrize(("rows", "compute_ns"), [(0, MS), (-1, MS), (4, -1)])
def test_observe_rejects_nonsense(rows: int, compute_ns: int) -> None:
    with pytest.raises(ValueError, match="observe"):
        _sched().observe(_key(), rows, compute_ns)


def test_aging_takes_at_most_every_other_batch_under_overload() -> None:
    """A low level that stays overdue (a flood past its age limit) must not starve level 1:
    an aging pick is never followed by another while level-1 work waits."""
    sched = _sched(weights=(4, 1))
    picks = []
    for i in range(20):
        now = T0 + i * 10 * MS
        flood = _view(priority=2, rows=16, now=now, aged_ms=500.0)  # always overdue
        trickle = _view(priority=1, rows=1, now=now, aged_ms=1.0)
        picks.append(sched.pick([flood, trickle], now))
    levels = [k.priority if k else 0 for k in picks]
    # Aging takes every other batch; level 1 wins 4 of 5 of the rest (weights 4:1).
    assert sum(1 for lv in levels if lv == 1) >= 8, levels


def test_aging_keeps_picking_when_everything_is_overdue() -> None:
    sched = _sched()
    now = T0
    only = _view(priority=2, rows=4, now=now, aged_ms=500.0)
    assert [sched.pick([only], now + i) for i in range(3)] == [only.key] * 3
