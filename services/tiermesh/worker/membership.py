"""The worker's membership of the mesh: heartbeats into the worker sets that routers admit
work by, deregistration, and taking over what dead members of the consumer group read and
never acknowledged (an entry delivered too often goes to the dead letters)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

import grpc
import structlog

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import JobResult
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.core.wire import decode_job
from tiermesh.worker.background import BackgroundResults, job_of
from tiermesh.worker.handoff import Handoff
from tiermesh.worker.intake import Intake
from tiermesh.worker.served import ServedUnits
from tiermesh.worker.streams import STREAM_ERRORS, Entry, WorkStreams
from tiermesh.worker.unwritten import Unwritten

log = structlog.get_logger("tiermesh.worker")


class Membership:
    """`heartbeats` and `reclaimer` are loops the Worker runs as tasks and cancels."""

    def __init__(
        self,
        *,
        streams: WorkStreams,
        units: ServedUnits,
        intake: Intake,
        handoff: Handoff,
        background: BackgroundResults | None,
        stopping: asyncio.Event,
        heartbeat_interval_ms: int,
        heartbeat_ttl_ms: int,
        reclaim_interval_ms: int,
        reclaim_min_idle_ms: int,
        max_deliveries: int,
        unwritten: Unwritten | None = None,
    ) -> None:
        self._streams = streams
        self._unwritten = unwritten or Unwritten()
        self._units = units
        self._intake = intake
        self._handoff = handoff
        self._background = background
        self._stopping = stopping
        self._hb_interval_s = heartbeat_interval_ms / 1000
        self._hb_ttl_ms = heartbeat_ttl_ms
        self._reclaim_interval_s = reclaim_interval_ms / 1000
        self._reclaim_min_idle_ms = reclaim_min_idle_ms
        self._max_deliveries = max_deliveries
        self._leaving = False
        self.reclaimed = 0
        self.dead_lettered = 0

    # -- the worker sets -------------------------------------------------------------------

    async def beat(self, units: list[ComputeUnit]) -> None:
        """Register `units` as served here for online admission (not from a batch pool),
        with the execution provider each one's session got."""
        if self._units.online:
            await self._streams.heartbeat(
                units, self._units.tier, self._hb_ttl_ms, self._units.providers(units)
            )

    async def heartbeats(self) -> None:
        """Beat for the units served every interval, until `leave`."""
        while not self._leaving:
            try:
                await self.beat(self._units.serving)
            except STREAM_ERRORS as exc:
                log.warning("heartbeat failed", error=str(exc))
            raise_if_cancelling()
            await asyncio.sleep(self._hb_interval_s)

    async def leave(self) -> None:
        """Stop heartbeating and deregister every unit with a session."""
        self._leaving = True
        await self.deregister()

    async def deregister(self) -> None:
        try:
            await self._streams.leave(self._units.configs, self._units.tier)
        except STREAM_ERRORS:
            log.warning("could not deregister worker")

    # -- dead members' entries -------------------------------------------------------------

    async def reclaimer(self) -> None:
        """`reclaim` every interval."""
        while True:
            await asyncio.sleep(self._reclaim_interval_s)
            await self.reclaim()
            raise_if_cancelling()

    async def reclaim(self) -> None:
        """Take over what dead workers read and never acknowledged, into the buffers (as
        much as they have room for). An entry delivered more than max_deliveries times is
        poison: dead-lettered, its caller told ABORTED; unless this worker computed it and
        could not pass its result on (worker/unwritten.py): then it is computed again."""
        rooms = {
            key: room
            for key in self._units.keys
            if key.unit in self._units.serving and (room := self._intake.room(key)) > 0
        }
        try:  # one round trip for every stream, not one each (~58 a second, idle or not)
            taken = await self._streams.reclaim_many(rooms, self._reclaim_min_idle_ms)
        except STREAM_ERRORS as exc:
            log.warning("reclaim failed", error=str(exc))
            return
        for key, entries in taken.items():
            if key.unit not in self._units.serving or self._stopping.is_set():
                continue  # unloaded meanwhile
            try:
                counts = await self._streams.deliveries(key, [e.entry_id for e in entries])
            except STREAM_ERRORS as exc:
                log.warning("reclaim failed", stream=key.name, error=str(exc))
                continue
            poison = [
                e
                for e in entries
                if counts.get(e.entry_id, 1) > self._max_deliveries
                and not self._unwritten.computed(key, e.entry_id)  # its result could not go
            ]
            fresh = [e for e in entries if e not in poison]
            if poison:
                await self._give_up(poison, counts)
            if fresh:
                self.reclaimed += len(fresh)
                log.warning("reclaimed entries of a dead worker", stream=key.name, n=len(fresh))
                await self._intake.collect(fresh)

    async def _give_up(self, entries: Sequence[Entry], counts: Mapping[str, int]) -> None:
        answers = []
        for e in entries:
            await self._streams.dead_letter(e, f"delivered {counts.get(e.entry_id)} times")
            self.dead_lettered += 1
            try:
                job = decode_job(e.fields[keys.JOB_FIELD.encode()])
            except Exception:
                continue
            answers.append(
                JobResult.for_job(
                    job,
                    code=grpc.StatusCode.ABORTED,
                    message=f"given up after {counts.get(e.entry_id)} failed deliveries",
                )
            )
        log.error("dead-lettered entries", n=len(entries))
        if self._background is not None:  # batch-job inputs: an error result in their job
            with contextlib.suppress(*STREAM_ERRORS):
                await self._background.write(answers)
            answers = [a for a in answers if job_of(a.controls) is None]
        if answers:
            try:
                await self._handoff.process(answers)
            except grpc.aio.AioRpcError as exc:
                log.warning("could not tell callers of dead-lettered entries", code=exc.code().name)
