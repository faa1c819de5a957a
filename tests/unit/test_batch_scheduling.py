"""Background (batch-job) work in the worker's scheduler, and the pure batch-job plans."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import numpy as np
import pytest

from tests.integration.conftest import Downstream, downstream  # noqa: F401 (a fixture)
from tests.unit import test_worker_loop as loop_test
from tests.unit.test_scheduler import MS, T0, UNIT, _cfg, _key, _view
from tests.unit.test_worker_loop import Harness, make  # noqa: F401 (a fixture)
from tiermesh.batch.plan import (
    CANCELLED,
    QUEUED,
    RUNNING,
    JobRecord,
    bucket_delta,
    eta_s,
    feed_count,
    histogram_buckets,
    histogram_quantile,
    parse_request_id,
    request_id,
    summary,
)
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.keys import BACKGROUND_PRIORITY
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.tensors import from_numpy
from tiermesh.worker.__main__ import serve
from tiermesh.worker.scheduler import Scheduler

BG = BACKGROUND_PRIORITY


def _sched(share: float = 0.0) -> Scheduler:
    return Scheduler({UNIT: _cfg()}, background_share=share)


def test_background_never_before_online_work() -> None:
    s = _sched()
    bg = _view(BG, 0, rows=64, aged_ms=60_000)  # waited a minute: no aging for background
    online = _view(2, 1, rows=1)
    for _ in range(20):
        assert s.pick([bg, online], T0) == online.key


def test_background_taken_at_once_when_no_online_work() -> None:
    s = _sched()
    bg = _view(BG, 1, rows=3)
    assert s.pick([bg, _view(1, 0, rows=0)], T0) == bg.key
    assert s.wait_ms(bg, T0) == 0.0  # no batch wait: the feeder keeps enough queued


def test_yields_within_one_batch_when_online_arrives() -> None:
    s = _sched()
    bg = _view(BG, 0, rows=64)
    assert s.pick([bg], T0) == bg.key
    s.observe(bg.key, 32, 5 * MS)  # that background batch ran; online work arrived meanwhile
    online = _view(2, 0, rows=1, now=T0 + 5 * MS)
    assert s.pick([bg, online], T0 + 5 * MS) == online.key


def test_share_limit_lets_background_progress_under_online_load() -> None:
    s = _sched(share=0.25)
    bg, online = _view(BG, 0, rows=64), _view(1, 0, rows=32)
    picks = []
    for _ in range(400):
        key = s.pick([bg, online], T0)
        assert key is not None
        picks.append(key)
        s.observe(key, 8, 1 * MS)  # equal batch times: share of batches = share of time
    share = sum(k.priority == BG for k in picks[100:]) / 300
    assert 0.2 <= share <= 0.3


def _online_traffic(s: Scheduler, until: int) -> None:
    """100 online requests/s for the last second before `until`."""
    for i in range(100):
        s.arrived(_key(1, 0), 1, until - i * 10 * MS)


def test_unpaced_without_online_traffic() -> None:
    bg = _view(BG, 0, rows=64)
    # Every lane, and however long online entries last waited.
    s = Scheduler({UNIT: _cfg()}, lanes=2)
    s.online_waited(50 * MS)
    for _ in range(3):
        assert s.pick([bg], T0) == bg.key
        s.background_started()
    # Online traffic that stopped a while ago no longer paces.
    _online_traffic(s, T0)
    assert s.pick([bg], T0) is None
    later = T0 + 3000 * MS
    assert not s.online_present(later)
    assert s.pick([bg], later) == bg.key


def test_background_leaves_a_lane_to_online_traffic() -> None:
    bg = _view(BG, 0, rows=64)
    s = Scheduler({UNIT: _cfg()}, lanes=3)
    _online_traffic(s, T0)
    for _ in range(2):
        assert s.background_wait_ms(T0) == 0.0
        s.background_started()
    assert math.isinf(s.background_wait_ms(T0))
    assert s.pick([bg], T0) is None
    s.background_done()  # no pause follows
    assert s.pick([bg], T0) == bg.key
    # Online work is never held back by background work.
    online = _view(1, 0, rows=1)
    assert s.pick([bg, online], T0) == online.key
    # One lane: background takes it, one batch at a time.
    one = Scheduler({UNIT: _cfg()}, lanes=1)
    _online_traffic(one, T0)
    assert one.pick([bg], T0) == bg.key
    one.background_started()
    assert one.pick([bg], T0) is None


def test_background_pauses_while_online_entries_wait_beyond_the_target() -> None:
    bg = _view(BG, 0, rows=64)
    s = Scheduler({UNIT: _cfg()}, lanes=2, background_target_wait_ms=2.0)
    _online_traffic(s, T0)
    s.online_waited(2 * MS)  # at the target: goes on
    assert s.pick([bg], T0) == bg.key
    s.online_waited(2 * MS + 1)  # beyond it: paused, nothing in flight or not
    assert math.isinf(s.background_wait_ms(T0))
    assert s.pick([bg], T0) is None
    # Paused until a read finds online entries that waited within the target again.
    s.online_waited(1 * MS)
    assert s.pick([bg], T0) == bg.key
    # Or until online traffic stops.
    s.online_waited(30 * MS)
    assert s.pick([bg], T0) is None
    assert s.pick([bg], T0 + 3000 * MS) == bg.key


def test_background_batches_fit_the_yield_while_online_traffic_needs_the_one_lane() -> None:
    s = _sched()  # yield_ms 10 by default, one lane
    key = _key(BG, 1)
    for rows in [1, 2, 4, 8, 3, 6] * 3:  # 1 ms + 2 ms per row: 4 rows take 9 ms, 5 take 11
        s.observe(key, rows, round((1 + 2 * rows) * MS))
    assert s.background_rows(key) == 5  # throughput-optimal: ~90% of the best per row
    view = _view(BG, 1, rows=16)
    assert s.batch_rows(view, T0) == 5
    _online_traffic(s, T0)
    assert s.batch_rows(view, T0) == 4  # the lane held no longer than the yield
    # With two lanes online work has one of its own: no cut.
    two = Scheduler({UNIT: _cfg()}, lanes=2)
    for rows in [1, 2, 4, 8, 3, 6] * 3:
        two.observe(key, rows, round((1 + 2 * rows) * MS))
    _online_traffic(two, T0)
    assert two.batch_rows(view, T0) == 5


def test_background_batches_keep_a_cost_fit_of_their_own() -> None:
    s = _sched()
    s.observe(_key(2, 0), 1, 4 * MS)
    for rows in (4, 8, 2):
        s.observe(_key(BG, 0), rows, 30 * MS)  # on idle threads, beside other work
    assert s.compute_estimate_ns(_key(2, 0), 1) == 4 * MS
    assert s.compute_estimate_ns(_key(BG, 0), 4) >= 20 * MS


async def test_the_worker_paces_background_from_the_online_queue_wait_it_reads(
    make: Callable[..., Awaitable[Harness]],  # noqa: F811
) -> None:
    h = await make(lanes=2)
    scheduler = h.worker._scheduler

    def route(request_id: str, waited_ms: int) -> None:
        """An online request of two rows, enqueued `waited_ms` before the worker's now."""
        h.streams.add(
            loop_test.HIGH,
            Job(
                request_id=request_id,
                model=loop_test.UNIT.model,
                inputs=(from_numpy("INPUT0", np.ones((2, 4), np.float32), "FP32"),),
                gateway="127.0.0.1:1",
                priority=1,
                tier="center",
                timing=Timing(routed_ns=h.clock.now, enqueued_ns=h.clock.now - waited_ms * MS),
            ),
        )

    route("late", 5)  # read 5 ms after it was queued: beyond the 2 ms target
    await h.steps()
    assert math.isinf(scheduler.background_wait_ms(h.clock.now))
    route("prompt", 1)
    await h.steps()
    assert scheduler.background_wait_ms(h.clock.now) == 0.0


@pytest.mark.parametrize(("lanes", "target"), [(0, 2.0), (1, -1.0)])
def test_lanes_and_target_wait_must_make_sense(lanes: int, target: float) -> None:
    with pytest.raises(ValueError, match="lanes"):
        Scheduler({UNIT: _cfg()}, lanes=lanes, background_target_wait_ms=target)


def test_background_batches_are_large() -> None:
    s = _sched()
    key = _key(BG, 1)
    # Nothing measured yet: the bucket's maximum.
    assert s.background_rows(key) == 16
    assert s.batch_rows(_view(BG, 1, rows=40), T0) == 16
    # Mostly fixed cost (1 ms + 0.01 ms per row): the maximum, still.
    for rows in (1, 4, 8, 16, 2, 12):
        s.observe(key, rows, MS + rows * 10_000)
    assert s.background_rows(key) == 16
    # Mostly per-row cost (0.1 ms + 1 ms per row): a batch of ~1 is within 10% already.
    key0 = _key(BG, 0)
    for rows in (1, 4, 8, 16, 2, 12):
        s.observe(key0, rows, 100_000 + rows * MS)
    assert 1 <= s.background_rows(key0) < 4
    # Online batch sizes are not touched by background work.
    assert s.batch_rows(_view(1, 0, rows=40), T0) == 16  # its largest preferred size


def _job(**kw: object) -> JobRecord:
    base: dict[str, object] = dict(
        job_id="j", tenant="t", model="echo", variant="", status=RUNNING, total=1000,
        fed=0, done=0, errors=0, created_ms=1_000,
    )  # fmt: skip
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def test_feed_count_keeps_the_queue_bounded() -> None:
    assert feed_count(_job(status=QUEUED), max_queued=256, chunk=64) == 64
    assert feed_count(_job(fed=250, done=10), max_queued=256, chunk=64) == 16
    assert feed_count(_job(fed=256), max_queued=256, chunk=64) == 0
    assert feed_count(_job(fed=990, done=980), max_queued=256, chunk=64) == 10  # the end
    assert feed_count(_job(fed=1000, done=999), max_queued=256, chunk=64) == 0
    assert feed_count(_job(status=CANCELLED), max_queued=256, chunk=64) == 0
    assert feed_count(_job(status="loading"), max_queued=256, chunk=64) == 0


def test_job_record_round_trips_through_its_hash() -> None:
    job = _job(fed=10, done=5, errors=1, finished_ms=9, tier="edge", version="2")
    assert JobRecord.from_fields(job.fields()) == job
    assert (job.finished, job.in_queue) == (6, 4)


def test_request_ids_and_eta_and_summary() -> None:
    assert parse_request_id(request_id("abc", 17)) == ("abc", 17)
    assert eta_s(_job(done=500), 100.0) == 5.0
    assert eta_s(_job(done=0), 0.0) is None
    assert eta_s(_job(done=1000), 0.0) == 0.0
    s = summary(_job(done=990, errors=10, finished_ms=11_000), now_ms=99_999)
    assert (s.inputs, s.errors, s.wall_s, round(s.per_hour)) == (1000, 10, 10.0, 360_000)


def test_online_p99_from_histogram_scrapes() -> None:
    text = "\n".join(
        [
            'tiermesh_request_duration_seconds_bucket{model="a",le="0.01"} 90',
            'tiermesh_request_duration_seconds_bucket{model="a",le="0.1"} 100',
            'tiermesh_request_duration_seconds_bucket{model="a",le="+Inf"} 100',
            'other_bucket{le="0.1"} 7',
        ]
    )
    after = histogram_buckets(text, "tiermesh_request_duration_seconds")
    assert after == {0.01: 90.0, 0.1: 100.0, math.inf: 100.0}
    delta = bucket_delta({0.01: 40.0, 0.1: 40.0, math.inf: 40.0}, after)
    assert delta == {0.01: 50.0, 0.1: 60.0, math.inf: 60.0}
    assert math.isclose(histogram_quantile(0.99, delta), 0.01 + 0.09 * (59.4 - 50) / 10)
    assert math.isnan(histogram_quantile(0.99, {}))


async def test_a_batch_pool_worker_must_take_batch_jobs() -> None:
    settings = WorkerSettings(worker_online=False, batch_jobs=False)
    with pytest.raises(ValueError, match="batch pool worker"):
        await serve(settings, asyncio.Event())
