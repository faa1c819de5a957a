"""The batched worker's loop: it only moves data, between its parts. Intake (reads and
buffers, drops what must not compute), the scheduler (pure: which stream, when, how many),
the executor (onnxruntime, poison isolation, cascade), the outbox (hand-off, then ack),
membership (heartbeats, reclaim, dead letters) and model control (units opened and closed).
Every Redis call is about a whole batch; `WorkStreams` is all the loop knows of Redis."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.control_watch import ControlState
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig
from tiermesh.core.telemetry import Telemetry
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.batching import QueuedJob, cancel_check_first
from tiermesh.worker.control import WorkerModelControl
from tiermesh.worker.executor import Executor
from tiermesh.worker.handoff import Handoff
from tiermesh.worker.intake import Intake
from tiermesh.worker.lanes import ComputeMode, ComputeThreads, Lanes, run_inline
from tiermesh.worker.membership import Membership
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.outbox import MAX_HANDOFFS_IN_FLIGHT, BatchOutbox
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.scheduler import (
    DEFAULT_BACKGROUND_TARGET_WAIT_MS,
    Scheduler,
    is_background,
)
from tiermesh.worker.served import ServedUnits
from tiermesh.worker.streams import WorkStreams
from tiermesh.worker.units import UnitControl
from tiermesh.worker.unwritten import Unwritten

# A quarter of the message limit (core/message_bytes.py), as the gateway's router batches.
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024


class Worker:
    """Serves the streams of its models on one tier. `run` returns after `stop()` once
    every entry it had read is handed off (or left unacknowledged for recovery).

    Tests drive it without `run`: `open`, then `step` as often as they like, then `drain`,
    with an injected `clock_ns` and `sleep` (the pause while a batch fills)."""

    def __init__(
        self,
        *,
        tier: str,
        configs: Mapping[ComputeUnit, ModelConfig],
        runners: Mapping[ComputeUnit, ModelRunner],
        streams: WorkStreams,
        handoff: Handoff,
        telemetry: Telemetry,
        poll_block_ms: int = 200,
        heartbeat_interval_ms: int = 1000,
        heartbeat_ttl_ms: int = 10_000,
        clock_ns: Callable[[], int] = time.time_ns,
        metrics: WorkerMetrics | None = None,
        reclaim_interval_ms: int = 1000,
        reclaim_min_idle_ms: int = 5000,
        max_deliveries: int = 3,
        control: UnitControl | None = None,
        background: BackgroundResults | None = None,
        background_share: float = 0.0,
        background_target_wait_ms: float = DEFAULT_BACKGROUND_TARGET_WAIT_MS,
        online: bool = True,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        lanes: int = 1,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        compute_nice: int = 0,
    ) -> None:
        # online False: a batch pool worker (see ServedUnits). background: batch-job work
        # (background streams) is read, computed in the gaps of online work and written
        # into its job; None: this worker takes none. lanes: batches computing at once
        # (worker/lanes.py); with one, `step` returns once its batch is computed.
        # max_batch_bytes: what a batch's requests (their stream entries) add up to at most,
        # below the hand-off's message limit (one bigger request computes alone).
        # compute_nice: lanes compute at this much lower CPU priority (lanes.ComputeThreads).
        self.tier = tier
        self._clock_ns = clock_ns
        self._stopping = asyncio.Event()
        # Set once the consumer groups exist and the first heartbeat is out: from then on
        # routers admit work for this worker's models.
        self.started = asyncio.Event()
        self._units = units = ServedUnits(
            tier, configs, runners, online=online, background=background is not None
        )
        self._scheduler = scheduler = Scheduler(
            configs,
            background_share,
            max_batch_bytes,
            lanes=lanes,
            background_target_wait_ms=background_target_wait_ms,
        )
        self._intake = Intake(
            streams=streams,
            units=units,
            scheduler=scheduler,
            clock_ns=clock_ns,
            sleep=sleep,
            telemetry=telemetry,
            metrics=metrics,
            background=background,
            poll_block_ms=poll_block_ms,
            stopping=self._stopping,
        )
        self._threads = ComputeThreads(lanes, compute_nice)
        self._executor = Executor(
            streams=streams,
            units=units,
            scheduler=scheduler,
            clock_ns=clock_ns,
            telemetry=telemetry,
            metrics=metrics,
            threads=self._threads,
        )
        self._lanes = Lanes(lanes)
        unwritten = Unwritten()  # the outbox's, read by the reclaims
        self._outbox = BatchOutbox(
            streams=streams,
            handoff=handoff,
            scheduler=scheduler,
            clock_ns=clock_ns,
            background=background,
            in_flight=MAX_HANDOFFS_IN_FLIGHT if lanes == 1 else lanes + 1,
            unwritten=unwritten,
        )
        self._membership = Membership(
            streams=streams,
            units=units,
            intake=self._intake,
            handoff=handoff,
            background=background,
            stopping=self._stopping,
            heartbeat_interval_ms=heartbeat_interval_ms,
            heartbeat_ttl_ms=heartbeat_ttl_ms,
            reclaim_interval_ms=reclaim_interval_ms,
            reclaim_min_idle_ms=reclaim_min_idle_ms,
            max_deliveries=max_deliveries,
            unwritten=unwritten,
        )
        self._control = control
        self._model_control = WorkerModelControl(
            control=control,
            units=units,
            scheduler=scheduler,
            intake=self._intake,
            membership=self._membership,
            streams=streams,
            handoff=handoff,
            background=background,
            metrics=metrics,
            computing=self._lanes.busy,
        )
        self._streams = streams

    # -- counts, for the log line at exit and for tests -------------------------------------

    @property
    def computed_rows(self) -> int:
        return self._executor.computed_rows

    @property
    def inline_batches(self) -> int:
        """Batches computed on the loop's own thread (lanes.run_inline)."""
        return self._executor.inline_batches

    @property
    def expired(self) -> int:
        return self._intake.expired

    @property
    def cancelled(self) -> int:
        return self._intake.cancelled

    @property
    def cascaded(self) -> int:
        return self._executor.cascaded

    @property
    def reclaimed(self) -> int:
        return self._membership.reclaimed

    @property
    def dead_lettered(self) -> int:
        """Poison requests (the model fails on them) and entries delivered too often."""
        return self._executor.dead_lettered + self._membership.dead_lettered

    @property
    def serving(self) -> list[ComputeUnit]:
        """The units this worker reads and heartbeats for."""
        return self._units.serving

    # -- lifecycle ----------------------------------------------------------------------

    def stop(self) -> None:
        """Stop intake: no more reads; buffered entries are still finished."""
        self._stopping.set()

    async def leave(self) -> None:
        """First stage of a graceful stop: stop heartbeating and deregister, so routers send
        nothing more here, while intake goes on (what was routed here meanwhile still gets
        read). Call `stop()` after a short window."""
        await self._membership.leave()

    async def open(self) -> None:
        """Create the consumer groups and send the first heartbeat (then `started` is set:
        routers admit work for this worker's units). Called once, by `run` or a test."""
        await self._streams.ensure_groups(self._units.keys)
        await self._membership.beat(self.serving)
        self.started.set()
        for unit in self.serving:
            self._model_control.unit_metric(unit, True)

    async def run(self) -> None:
        """`open`, take back this consumer's own pending entries, then `step` until stopped
        and nothing read is left; heartbeats, reclaim and model control run meanwhile in
        tasks owned here. Returns once every hand-off is finished and the worker left."""
        await self.open()
        owned = [
            asyncio.create_task(self._membership.heartbeats(), name="worker-heartbeat"),
            asyncio.create_task(self._membership.reclaimer(), name="worker-reclaimer"),
        ]
        if self._control is not None:
            watch = self._control.watch.run(self._control.interval_s, self.apply)
            owned.append(asyncio.create_task(watch, name="worker-model-control"))
        try:
            await self._intake.read_pending()
            while not self._stopping.is_set() or self._intake.buffered():
                await self.step()
        finally:
            # Computing batches and hand-offs are never cancelled: publish, then ack, even
            # while stopping.
            await self._lanes.settle()
            await self._outbox.drain()
            for task in owned:
                task.cancel()
            await asyncio.gather(*owned, return_exceptions=True)
            self._threads.close()
            await self._membership.deregister()

    async def step(self) -> None:
        """One turn of the loop: wait for a free compute lane, drop the sessions of units
        done closing, read what arrived (unless stopping), drop what expired, then pick one
        stream, fill its batch until the scheduler closes it, drop what must not compute,
        and compute it on the lane: with one lane here (the step returns once it is
        computed), with several in a task of the lanes (the step returns at once, and the
        next one fills the next batch meanwhile; `drain` awaits them), or, a short batch on
        an otherwise idle worker, on the loop's own thread (lanes.run_inline). Its hand-off
        and ack go on in a task of the outbox. At most one batch per lane, plus one, is computed
        and not yet handed off, so a step waits for a slot beyond that."""
        await self._lanes.acquire()
        try:
            dispatched = await self._dispatch()
        except BaseException:
            self._lanes.release()
            raise
        if dispatched is None:
            self._lanes.release()
            return
        key, work, mode = dispatched
        if mode is ComputeMode.INLINE:
            await self._lanes.run(key.unit, work)
            # The hand-off's task, then its stream's pump, take their turns before this
            # loop reads again: the read's work would otherwise come before the answer's.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
        elif self._lanes.count == 1:
            await self._lanes.run(key.unit, work)
        else:
            self._lanes.start(key.unit, work, is_background(key))
            # The batch's task runs up to its compute (and its cancel read is sent) before
            # this loop reads again: the read would otherwise delay a lone request.
            await asyncio.sleep(0)

    async def _dispatch(
        self,
    ) -> tuple[StreamKey, Coroutine[Any, Any, None], ComputeMode] | None:
        """Everything of a step before compute; None when there is nothing to compute."""
        await self._model_control.retire()
        if not self._stopping.is_set():
            await self._intake.read_new()
        await self._intake.sweep_expired()
        key = self._scheduler.pick(self._intake.views(), self._clock_ns())
        if key is None:
            return None
        await self._intake.fill(key)
        rows = self._scheduler.batch_rows(self._intake.view(key), self._clock_ns())
        batch = self._intake.take(key, rows)
        started = self._clock_ns()
        interval = self._outbox.interval(key, batch, started)
        background = is_background(key)
        await self._outbox.reserve(background)
        # Batch jobs and requests that waited read their cancel flags first; fresh online
        # requests compute meanwhile (worker/batching.py cancel_check_first).
        first = background or cancel_check_first(batch, started)
        try:
            live = await self._intake.skip(key, batch, cancelled_too=first)
        except BaseException:
            self._outbox.release(background)
            raise
        if not live:
            self._outbox.release(background)
            return None
        if first:
            mode = ComputeMode.CHECKED
        elif run_inline(
            # Batch jobs count for neither: their threads yield the cores (SCHED_IDLE), and
            # their hand-off can wait the few ms; online work computes as if alone.
            self._lanes.online_computing,
            self._outbox.unsent,
            self._intake.online_buffered(),
            self._scheduler.compute_estimate_ns(key, sum(q.job.rows for q in live)),
        ):
            # No cancel read at all: a caller that left within those few ms gets its answer
            # dropped by its gateway as late, which costs less than a Redis round trip on
            # every request at low load.
            mode = ComputeMode.INLINE
        else:
            mode = ComputeMode.BESIDE
        return key, self._compute(key, live, started, interval, mode), mode

    async def _compute(
        self,
        key: StreamKey,
        live: list[QueuedJob],
        started: int,
        interval: int,
        mode: ComputeMode,
    ) -> None:
        """Compute one batch (its hand-off slot is reserved) as `mode` says, and give it to
        the outbox."""
        background = is_background(key)
        check = None
        if mode is ComputeMode.BESIDE:
            check = asyncio.create_task(self._intake.left_meanwhile(key, live))
        try:
            live, done = await self._executor.run(key, live, mode is ComputeMode.INLINE)
            if check is not None:
                gone = await check
                live = [q for q in live if q.job.request_id not in gone]
                done = [r for r in done if r.request_id not in gone]
        except BaseException:
            if check is not None:
                check.cancel()
            self._outbox.release(background)
            raise
        if not live and not done:
            self._outbox.release(background)
            return
        self._outbox.send(key, live, done, started, interval)

    async def drain(self) -> None:
        """Returns once every batch dispatched so far is computed, handed off and
        acknowledged (or given up and left pending); raises what a compute lane failed
        with."""
        try:
            await self._lanes.drain()
        finally:
            await self._outbox.drain()

    async def reclaim(self) -> None:
        """One pass of the reclaimer (`run` does one every reclaim interval)."""
        await self._membership.reclaim()

    async def apply(self, state: ControlState) -> None:
        """Follow model control (see WorkerModelControl.apply); only with a UnitControl."""
        await self._model_control.apply(state)
