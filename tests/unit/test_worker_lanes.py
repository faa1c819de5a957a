"""worker/lanes.py: the compute plan (pure) and the lanes' bookkeeping."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading

import pytest

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import BACKGROUND_PRIORITY
from tiermesh.worker.lanes import (
    INLINE_MAX_NS,
    MAX_AUTO_LANES,
    ComputePlan,
    ComputeThreads,
    Lanes,
    plan,
    run_inline,
)

UNIT = ComputeUnit("m", "1", "fp32")


@pytest.mark.parametrize(
    ("threads", "lanes", "cores", "want"),
    [
        (0, 0, 2, ComputePlan(1, 2)),  # the reference machine: two one-thread lanes
        (0, 0, 1, ComputePlan(1, 1)),
        (0, 0, 8, ComputePlan(2, MAX_AUTO_LANES)),
        (0, 0, 16, ComputePlan(4, MAX_AUTO_LANES)),
        (1, 0, 8, ComputePlan(1, 1)),  # threads given (the edge worker): one lane of them
        (2, 0, 2, ComputePlan(2, 1)),
        (0, 1, 2, ComputePlan(2, 1)),  # one lane asked for: it takes the cores
        (0, 3, 2, ComputePlan(1, 3)),
        (2, 3, 16, ComputePlan(2, 3)),  # both given: as given
        (0, 0, 0, ComputePlan(1, 1)),  # no core count known
    ],
)
def test_plan(threads: int, lanes: int, cores: int, want: ComputePlan) -> None:
    assert plan(threads, lanes, cores) == want


def test_lanes_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Lanes(0)


async def test_a_unit_is_busy_while_its_batch_computes_and_the_lane_comes_back() -> None:
    lanes = Lanes(2)
    go = asyncio.Event()

    async def work() -> None:
        await go.wait()

    await lanes.acquire()
    lanes.start(UNIT, work())
    await lanes.acquire()
    lanes.start(UNIT, work())
    assert lanes.busy(UNIT) and not lanes.busy(ComputeUnit("other", "1", "fp32"))
    assert lanes.computing == 2
    third = asyncio.create_task(lanes.acquire())
    await asyncio.sleep(0)
    assert not third.done()  # both lanes taken
    go.set()
    await third
    lanes.release()
    await lanes.drain()
    assert not lanes.busy(UNIT) and lanes.computing == 0


async def test_a_failed_lane_is_raised_by_drain_and_the_next_acquire() -> None:
    lanes = Lanes(2)

    async def fails() -> None:
        raise OSError("disk gone")

    await lanes.acquire()
    lanes.start(UNIT, fails())
    await lanes.settle()  # settles without raising
    with pytest.raises(OSError, match="disk gone"):
        await lanes.drain()
    with pytest.raises(OSError, match="disk gone"):
        await lanes.acquire()
    assert not lanes.busy(UNIT)


async def test_one_lane_runs_its_batch_in_the_caller() -> None:
    lanes = Lanes(1)
    ran: list[bool] = []

    async def work() -> None:
        ran.append(lanes.busy(UNIT))

    await lanes.acquire()
    await lanes.run(UNIT, work())
    assert ran == [True] and lanes.computing == 0
    await lanes.acquire()  # the lane was given back


@pytest.mark.parametrize(
    ("computing", "unsent", "waiting", "estimate_ns", "want"),
    [
        (0, 0, False, 500_000, True),
        (0, 0, False, INLINE_MAX_NS, True),
        (0, 0, False, INLINE_MAX_NS + 1, False),  # too long to hold the loop
        (0, 0, False, 0, False),  # nothing observed yet
        (1, 0, False, 500_000, False),  # another lane computes: the loop has work
        (0, 1, False, 500_000, False),  # a hand-off is still to be written
        (0, 0, True, 500_000, False),  # more was read: the next batch can start meanwhile
    ],
)
def test_run_inline(
    computing: int, unsent: int, waiting: bool, estimate_ns: int, want: bool
) -> None:
    assert run_inline(computing, unsent, waiting, estimate_ns) is want


def _nice_of_this_thread() -> tuple[str, int]:
    tid = threading.get_native_id()
    return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, tid)


@pytest.mark.parametrize(
    ("nice", "priority", "want"),
    [(0, 1, 0), (0, 2, 0), (3, 1, 3), (3, 2, 8), (3, 3, 8), (3, 0, 13), (10, 0, 19)],
)
async def test_compute_threads_run_below_the_loops_priority_and_lower_levels_lower(
    nice: int, priority: int, want: int
) -> None:
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    threads = ComputeThreads(2, nice)
    try:
        assert threads.nice_for(priority) == want
        name, theirs = await threads.call(priority, _nice_of_this_thread)
        # A second call of the level runs on a thread of the same nice.
        assert (await threads.call(priority, _nice_of_this_thread))[1] == theirs
    finally:
        threads.close()
    assert name.startswith("worker-compute")
    assert theirs == min(own + want, 19)
    # The loop's own thread keeps its priority.
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == own


def _policy_of_this_thread() -> int:
    return os.sched_getscheduler(threading.get_native_id())


async def test_batch_jobs_compute_on_idle_threads_and_online_levels_do_not() -> None:
    threads = ComputeThreads(1, 10)
    try:
        assert await threads.call(BACKGROUND_PRIORITY, _policy_of_this_thread) == os.SCHED_IDLE
        assert await threads.call(2, _policy_of_this_thread) == os.SCHED_OTHER
    finally:
        threads.close()
    assert _policy_of_this_thread() == os.SCHED_OTHER  # the loop's own thread


async def test_compute_threads_carry_the_callers_context() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("span", default="none")
    var.set("the batch's span")
    threads = ComputeThreads(1)
    try:
        assert await threads.call(1, var.get) == "the batch's span"
    finally:
        threads.close()


def test_compute_nice_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="nice"):
        ComputeThreads(1, -1)
