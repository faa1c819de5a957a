"""Compute lanes: batches of the batched loop that compute at the same time, each an
onnxruntime call on the same session (one session per unit: its weights are loaded once,
and a session runs concurrent calls safely). While one lane computes, the loop reads,
picks and fills the next batch and starts it on a free lane.

Small transformer batches use one core poorly, a second thread of the same call little
better: on the 2-core reference machine two one-thread lanes compute ~5-20% more sequences
per second than one two-thread call, and a batch of one is no slower (benchmarks/RESULTS.md,
issue 21). `plan` decides threads and lanes; `Lanes` owns the lane tasks."""

from __future__ import annotations

import asyncio
import contextvars
import enum
import functools
import os
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import BACKGROUND_PRIORITY

log = structlog.get_logger("tiermesh.worker")
# Lanes chosen when neither threads nor lanes are set: one per core, at most this many.
MAX_AUTO_LANES = 4
# A batch expected to compute within this long on a lane (the scheduler's estimate: its
# hand-over to a thread and back included), on a worker with nothing else computing or
# being handed off, runs on the loop's own thread instead: the hand-over cost ~0.5 ms of a
# 16-token request's latency at concurrency 1 on the reference machine (benchmarks/
# RESULTS.md, issue 21), and the loop has nothing to do meanwhile. Inline it takes less
# than estimated (no hand-over, the wide session's threads): one 16-token text of
# MiniLM-L3 is estimated 2.6-3.4 ms on a lane here (3 ms, the bound before, split workers
# between the two) and computes in ~1.5-2 ms inline. The loop is held no longer than the
# bound.
INLINE_MAX_NS = 5_000_000

T = TypeVar("T")
# Compute threads of lower levels run this much further below priority 1's (ComputeThreads).
LOWER_LEVEL_NICE = 5
MAX_NICE = 19


class ComputeMode(enum.Enum):
    """Where a dispatched batch computes, and when its cancel marks are read."""

    CHECKED = "checked"  # on a lane, the marks read before (requests that waited, batch jobs)
    BESIDE = "beside"  # on a lane, the marks read while it computes (fresh requests)
    INLINE = "inline"  # on the loop's thread, no read (run_inline: a short batch, idle worker)


@dataclass(frozen=True, slots=True)
class ComputePlan:
    threads: int  # onnxruntime intra-op threads per session call (0: onnxruntime's choice)
    lanes: int


def plan(intra_op_threads: int, lanes: int, cores: int) -> ComputePlan:
    """Threads per call and lanes for the batched models of a worker on `cores` cores.
    Both 0 (the default): up to MAX_AUTO_LANES lanes sharing the cores, one or more
    threads each. Threads set and lanes not: one lane of those threads (a worker given so
    much compute keeps to it). Lanes set and threads not: the cores shared among them."""
    cores = max(1, cores)
    if lanes == 0 and intra_op_threads > 0:
        return ComputePlan(intra_op_threads, 1)
    if lanes == 0:
        lanes = min(cores, MAX_AUTO_LANES)
    threads = intra_op_threads or max(1, cores // lanes)
    return ComputePlan(threads, lanes)


def run_inline(computing: int, unsent: int, waiting: bool, estimate_ns: int) -> bool:
    """Whether the next batch computes on the loop's thread: no other batch computing, no
    hand-off still to be written (`unsent`: one on the wire only waits for its reply and
    ack, which can wait a few ms) and nothing else read and waiting (the loop would have
    nothing to do meanwhile), and a known compute estimate of at most INLINE_MAX_NS (0:
    nothing observed yet, so a thread). A lone caller's next request often comes while the
    previous batch's ack is still on its way."""
    return computing == 0 and unsent == 0 and not waiting and 0 < estimate_ns <= INLINE_MAX_NS


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity, as taskset or a cgroup cpuset set)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class Lanes:
    """Owns the tasks of batches computing at once, at most `count`. `acquire` waits for a
    free lane; `start` runs a batch on it (or, with one lane, the caller awaits `run`
    instead: the loop stays as simple as it was). A lane task that fails makes the next
    `acquire` raise, so the loop fails as it would have inline. `busy(unit)`: a batch of
    the unit is computing (its session must stay)."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"compute lanes must be at least 1, got {count}")
        self.count = count
        self._free = asyncio.Semaphore(count)
        self._tasks: set[asyncio.Task[None]] = set()
        self._background: set[asyncio.Task[None]] = set()  # of `_tasks`: batch-job batches
        self._units: Counter[ComputeUnit] = Counter()
        self._failure: BaseException | None = None

    async def acquire(self) -> None:
        self._raise_failure()
        await self._free.acquire()
        if self._failure is not None:
            self._free.release()
            self._raise_failure()

    def release(self) -> None:
        self._free.release()

    def busy(self, unit: ComputeUnit) -> bool:
        return self._units[unit] > 0

    @property
    def computing(self) -> int:
        return len(self._tasks)

    @property
    def online_computing(self) -> int:
        """Lane tasks computing online (not batch-job) batches."""
        return len(self._tasks) - len(self._background)

    async def run(self, unit: ComputeUnit, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` on the lane acquired, here; the lane is free again after it."""
        self._units[unit] += 1
        await self._finish(unit, work)

    def start(
        self, unit: ComputeUnit, work: Coroutine[Any, Any, None], background: bool = False
    ) -> None:
        """Run `work` on the lane acquired, in a task owned here (see `drain`); the unit is
        busy from now on, not only once the task runs. `background`: a batch-job batch
        (it does not count in `online_computing`)."""
        self._units[unit] += 1
        task = asyncio.create_task(self._finish(unit, work), name="worker-lane")
        self._tasks.add(task)
        if background:
            self._background.add(task)
        task.add_done_callback(self._done)

    async def _finish(self, unit: ComputeUnit, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        finally:
            self._units[unit] -= 1
            self._free.release()

    async def settle(self) -> None:
        """Returns once every batch started so far is computed (and its hand-off given to
        the outbox), failed or not. A computing batch is never cancelled: its session call
        could not be stopped anyway, and its hand-off must follow."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def drain(self) -> None:
        """`settle`, then raise what a lane failed with."""
        await self.settle()
        self._raise_failure()

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._background.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and self._failure is None:
            log.error("compute lane failed", error=repr(exc))
            self._failure = exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure


class ComputeThreads:
    """The threads lane batches compute on, at `nice` below the worker's own CPU priority
    (Linux keeps a nice value per thread), and lower still for lower levels: priority 1 at
    `nice`, lower online levels LOWER_LEVEL_NICE more, batch jobs (background) twice that
    (at most 19) and SCHED_IDLE (`_lower_priority`). On cores shared with the request path
    (gateway, router, Redis, this worker's event loop) the kernel then runs those first and
    compute takes what is left: a request's hops no longer queue behind a long batch for a
    core. And a priority-1 batch computing beside a lower one gets most of a core they
    share, not half (CFS weights: ~3 to 1 at five nice levels apart). Compute still gets
    every core nobody else wants, so throughput on a machine doing nothing else is
    unchanged. One pool of `count` threads per nice value (and one SCHED_IDLE), made when
    first used; a thread never changes its nice (raising it again needs a privilege).
    onnxruntime's own intra-op threads (more than one thread per call) keep the priority
    of the thread that created the session."""

    def __init__(self, count: int, nice: int = 0) -> None:
        if nice < 0:
            raise ValueError(f"compute nice must be >= 0, got {nice}")
        self._count = max(1, count)
        self._nice = nice
        self._pools: dict[int, ThreadPoolExecutor] = {}

    def nice_for(self, priority: int) -> int:
        """The nice a batch of this priority level computes at (BACKGROUND_PRIORITY, 0:
        batch jobs)."""
        if not self._nice:
            return 0
        steps = 2 if priority == BACKGROUND_PRIORITY else min(max(priority - 1, 0), 1)
        return min(self._nice + steps * LOWER_LEVEL_NICE, MAX_NICE)

    async def call(self, priority: int, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a compute thread of this level, in the caller's context (as
        asyncio.to_thread)."""
        nice = self.nice_for(priority)
        idle = priority == BACKGROUND_PRIORITY and nice > 0
        slot = -1 if idle else nice  # the SCHED_IDLE pool apart from any nice value
        pool = self._pools.get(slot)
        if pool is None:
            pool = self._pools[slot] = ThreadPoolExecutor(
                max_workers=self._count,
                thread_name_prefix=f"worker-compute-nice{nice}",
                initializer=_lower_priority,
                initargs=(nice, idle),
            )
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(pool, functools.partial(context.run, fn, *args))

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False)


def _lower_priority(nice: int, idle: bool = False) -> None:
    """Lower the calling thread's CPU priority by `nice` (a pool thread's initializer);
    `idle`: batch jobs' threads, also SCHED_IDLE, so the kernel counts their core as free
    when it places a waking thread of the request path (it would queue it behind online
    compute on the other core instead of preempting a nice-19 thread)."""
    if not nice:
        return
    tid = threading.get_native_id()
    if idle:
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError) as exc:
            log.warning("batch-job compute threads are not SCHED_IDLE", error=str(exc))
    try:
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except (AttributeError, OSError) as exc:  # not Linux, or not allowed: same priority
        log.warning("compute threads keep the worker's CPU priority", error=str(exc))
