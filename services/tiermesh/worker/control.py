"""Model control in the batched worker: units opened and closed while it runs. A closing
unit is read no more, what is queued for it is answered UNAVAILABLE, what was read is
computed, and its session is dropped once nothing of it is left (`retire`).

The decisions (which units to open and close) are core/serving.py's; opening a session is
worker/units.py's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import structlog

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.control_watch import ControlState
from tiermesh.core.jobs import JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.serving import plan_units, worker_units
from tiermesh.core.wire import decode_job
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.handoff import Handoff
from tiermesh.worker.intake import Intake
from tiermesh.worker.membership import Membership
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.scheduler import Scheduler
from tiermesh.worker.served import ServedUnits
from tiermesh.worker.streams import STREAM_ERRORS, WorkStreams
from tiermesh.worker.units import UnitControl

log = structlog.get_logger("tiermesh.worker")
# Entries per stream read at a time while answering a closing unit's queue.
ANSWER_READ_COUNT = 256


class WorkerModelControl:
    """Changes the served set (`ServedUnits`) and everything that follows it: the
    scheduler's units, batch jobs' output steps, the streams read, the worker sets."""

    def __init__(
        self,
        *,
        control: UnitControl | None,
        units: ServedUnits,
        scheduler: Scheduler,
        intake: Intake,
        membership: Membership,
        streams: WorkStreams,
        handoff: Handoff,
        background: BackgroundResults | None,
        metrics: WorkerMetrics | None,
        computing: Callable[[ComputeUnit], bool] = lambda unit: False,
    ) -> None:
        # computing(unit): a batch of the unit is on a compute lane (its session stays).
        self._computing = computing
        self._control = control
        self._units = units
        self._scheduler = scheduler
        self._intake = intake
        self._membership = membership
        self._streams = streams
        self._handoff = handoff
        self._background = background
        self._metrics = metrics

    async def apply(self, state: ControlState) -> None:
        """Match the served set (called by the control watch with each new state, the
        repository already re-read): open the units wanted and not open, close those open
        and no longer wanted. A unit whose files do not check is not opened (logged)."""
        assert self._control is not None
        units = self._units
        configs = self._control.repo.configs
        wanted = worker_units(configs, self._control.names, state.unloaded)
        plan = plan_units(wanted, units.serving, units.closing)
        if not plan:
            return
        for unit in plan.close:
            await self._close(unit)
        for unit in plan.reopen:
            units.closing.discard(unit)
            log.info("model loaded again while closing; kept", unit=unit)
        for unit in plan.open:
            try:
                runner = await asyncio.to_thread(self._control.open, unit, wanted[unit])
            except Exception as exc:  # a bad checksum, or a model onnxruntime refuses
                log.error("model not loaded", unit=unit, problem=str(exc))
                continue
            units.configs[unit], units.runners[unit] = wanted[unit], runner
            log.info(
                "model loaded", unit=unit, load_s=round(runner.load_s, 3), provider=runner.provider
            )
        self._scheduler.set_units(units.configs)
        if self._background is not None:
            self._background.set_units(units.configs)
        units.refresh_keys()
        opened = [u for u in (*plan.open, *plan.reopen) if u in units.serving]
        if opened:
            # Groups first, then the heartbeat: from then on routers admit work for them.
            await self._streams.ensure_groups(k for k in units.keys if k.unit in opened)
            await self._membership.beat(opened)
            for unit in opened:
                self.unit_metric(unit, True)

    async def _close(self, unit: ComputeUnit) -> None:
        """Stop reading the unit's streams and heartbeating for it, deregister, and answer
        what is still queued for it UNAVAILABLE (nobody would compute it). What was read is
        computed; the main loop drops the session once that is done (`retire`)."""
        units = self._units
        units.closing.add(unit)
        units.refresh_keys()
        await self._streams.leave([unit], units.tier)
        buffered = sum(len(q) for k, q in self._intake.buffer.items() if k.unit == unit)
        log.info("model unloading", unit=unit, buffered=buffered)
        cfg = units.configs[unit]
        streams = keys.stream_keys(unit, units.tier, cfg.priority_levels, cfg.bucket_count)
        message = (
            f"model '{unit.model}' version {unit.version} was unloaded before this request ran"
        )
        units.draining.add(unit)
        try:
            await self._answer_queued(unit, streams, message)
        finally:
            units.draining.discard(unit)

    async def _answer_queued(
        self, unit: ComputeUnit, streams: list[StreamKey], message: str
    ) -> None:
        while entries := await self._streams.read(streams, ANSWER_READ_COUNT, None):
            answers = []
            for e in entries:
                with contextlib.suppress(Exception):
                    job = decode_job(e.fields[keys.JOB_FIELD.encode()])
                    answers.append(
                        JobResult.for_job(job, code=grpc.StatusCode.UNAVAILABLE, message=message)
                    )
            try:
                await self._handoff.process(answers)
            except grpc.aio.AioRpcError as exc:
                # They stay pending here, read again when the unit is loaded again.
                log.warning("could not answer unloaded requests", code=exc.code().name)
                return
            for stream in {e.stream for e in entries}:
                await self._streams.done(
                    stream, [e.entry_id for e in entries if e.stream == stream]
                )
            log.info("queued requests of an unloaded model answered", unit=unit, n=len(entries))

    async def retire(self) -> None:
        """Drop the sessions of closing units once nothing read for them is left: neither
        buffered nor computing on a lane."""
        units = self._units
        idle = [u for u in units.closing if u not in units.draining]
        done = [u for u in idle if not self._intake.buffered_for(u) and not self._computing(u)]
        for unit in done:
            units.closing.discard(unit)
            self._intake.forget(unit)
            del units.configs[unit], units.runners[unit]
            self._scheduler.set_units(units.configs)
            self.unit_metric(unit, False)
            log.info("model unloaded; session closed", unit=unit, tier=units.tier)
            try:  # again: a heartbeat sent while closing may have landed after the first
                await self._streams.leave([unit], units.tier)
            except STREAM_ERRORS:
                log.warning("could not deregister an unloaded model", unit=unit)

    def unit_metric(self, unit: ComputeUnit, loaded: bool) -> None:
        if self._metrics is not None:
            runner = self._units.runners.get(unit) if loaded else None
            provider = runner.provider if runner is not None else ""
            self._metrics.unit_loaded(unit, self._units.tier, loaded, provider)
