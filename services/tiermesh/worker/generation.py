"""A worker's loop for one generative compute unit: read requests from its streams into the
continuous-batching engine (tiermesh.generate), turn each request's tokens into text (stop
strings included) and send them on (worker/handoff.py: to their gateways, there is no output
step): pieces as they come when the caller streams, then the whole answer. Only moves data;
the decisions are the engine's scheduler's.

Entries are acknowledged once the final answer was handed off (publish, then ack), or once
nobody waits for it (the caller left, the deadline passed). While a request runs its entry
is touched now and then, so no worker's reclaim takes over a long generation; a dead
worker's entries are reclaimed and generated again from the start (the gateway skips the
pieces it has sent: the seed makes the tokens the same).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import grpc
import redis.asyncio as aioredis
import structlog
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.errors import INTERNAL_MESSAGE
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import extract
from tiermesh.core.tensors import to_numpy
from tiermesh.core.wire import decode_job
from tiermesh.generate.detok import TextStream
from tiermesh.generate.inputs import Sampling
from tiermesh.generate.scheduler import GenRequest
from tiermesh.generate.service import GenerationService, Stream
from tiermesh.generate.tensors import text_tensor
from tiermesh.worker.handoff import Handoff
from tiermesh.worker.metrics import GenerationMetrics
from tiermesh.worker.outbox import Outbox
from tiermesh.worker.streams import Entry, StreamClient

log = structlog.get_logger("tiermesh.worker.generation")

# Requests read beyond the engine's running bound, so a slot never waits for a Redis read.
READ_AHEAD = 2
# Ends after which nobody waits for an answer: the caller left, or was told DEADLINE_EXCEEDED.
UNANSWERED = ("cancelled", "deadline", "rejected:deadline")
# How an engine end is reported to the caller (finish_reason).
FINISH = {"stop": "stop", "length": "length"}


@dataclass(frozen=True)
class GenerationTimers:
    """How often the loops of a generative unit run (milliseconds)."""

    poll_block_ms: int = 200
    heartbeat_interval_ms: int = 1000
    heartbeat_ttl_ms: int = 10_000
    reclaim_interval_ms: int = 1000
    reclaim_min_idle_ms: int = 5000
    cancel_poll_ms: int = 100
    max_deliveries: int = 3

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> GenerationTimers:
        """The worker's own timers (the cancel poll keeps its default)."""
        return cls(
            poll_block_ms=settings.poll_block_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            heartbeat_ttl_ms=settings.heartbeat_ttl_ms,
            reclaim_interval_ms=settings.reclaim_interval_ms,
            reclaim_min_idle_ms=settings.reclaim_min_idle_ms,
            max_deliveries=settings.max_deliveries,
        )


@dataclass
class _Running:
    entry: Entry
    job: Job
    stream: Stream
    task: asyncio.Task[None] | None = None


class GenerationWorker:
    """Serves the streams of one generative unit on one tier. `run` returns after `stop()`
    once every request it took has ended and been handed off (or left for recovery)."""

    def __init__(
        self,
        *,
        unit: ComputeUnit,
        cfg: ModelConfig,
        tier: str,
        service: GenerationService,
        text: Callable[[Sequence[str]], TextStream],
        streams: StreamClient,
        handoff: Handoff,
        timers: GenerationTimers = GenerationTimers(),
        metrics: GenerationMetrics | None = None,
        tracer: trace.Tracer | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        provider: str = "",
    ) -> None:
        self._tracer = tracer or trace.get_tracer("tiermesh.worker.generation")
        assert cfg.generation is not None
        self.unit = unit
        self.tier = tier
        # The execution provider its session got, published with each heartbeat.
        self._providers = {unit: provider} if provider else {}
        self._limit = cfg.generation.max_sequences + READ_AHEAD
        self._service = service
        self._text = text
        self._streams = streams
        self._timers = timers
        self._metrics = metrics
        self._clock_ns = clock_ns
        self._keys = keys.stream_keys(unit, tier, cfg.priority_levels, 1)
        self._running: dict[str, _Running] = {}
        self._room = asyncio.Event()
        self._outbox = Outbox(handoff, streams)
        self._stopping = asyncio.Event()
        self._leaving = False
        self.started = asyncio.Event()
        self.generated = 0
        self.cancelled = 0

    def stop(self) -> None:
        """Stop intake; the requests taken run to their end."""
        self._stopping.set()
        self._room.set()

    async def leave(self) -> None:
        """Stop heartbeating and deregister: routers send nothing more here."""
        self._leaving = True
        with contextlib.suppress(aioredis.RedisError, OSError):
            await self._streams.leave([self.unit], self.tier)

    async def run(self) -> None:
        await self._streams.ensure_groups(self._keys)
        await self._beat()
        self.started.set()
        owned = [
            asyncio.create_task(self._service.run(), name=f"engine-{self.unit}"),
            asyncio.create_task(self._heartbeat(), name=f"heartbeat-{self.unit}"),
            asyncio.create_task(self._watch(), name=f"cancel-watch-{self.unit}"),
            asyncio.create_task(self._reclaim(), name=f"reclaim-{self.unit}"),
        ]
        for task in owned:
            task.add_done_callback(_log_failure)
        sender = asyncio.create_task(self._outbox.run(), name=f"handoff-{self.unit}")
        try:
            # What this consumer read before a restart and never acknowledged comes first.
            self._take(await self._streams.read(self._keys, self._limit, None, pending=True))
            while not self._stopping.is_set():
                room = self._free()
                if room <= 0:
                    self._room.clear()
                    await self._room.wait()
                    continue
                self._take(await self._read(room))
        finally:
            running = [r.task for r in self._running.values() if r.task is not None]
            await asyncio.gather(*running, return_exceptions=True)
            self._service.stop()
            # The last answers are handed off and acknowledged, never cut short.
            self._outbox.close()
            await asyncio.shield(sender)
            for task in owned:
                task.cancel()
            await asyncio.gather(*owned, return_exceptions=True)
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self._streams.leave([self.unit], self.tier)

    async def _read(self, room: int) -> list[Entry]:
        try:
            return await self._streams.read(self._keys, room, self._timers.poll_block_ms)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("redis read failed; retrying", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            return []

    # -- intake -------------------------------------------------------------------------

    def _take(self, entries: Iterable[Entry]) -> None:
        now = self._clock_ns()
        for entry in entries:
            try:
                job = decode_job(entry.fields[keys.JOB_FIELD.encode()])
            except Exception:
                log.error("undecodable stream entry dropped", stream=entry.stream.name)
                self._outbox.ack(entry)
                continue
            if job.request_id in self._running:
                continue  # read again (reclaimed while it runs here): it is running
            gen = job.generation
            if gen is None or (job.deadline_ns and job.deadline_ns <= now):
                self._outbox.ack(entry)  # expired: the gateway answered it already
                continue
            job = job.with_(timing=job.timing.with_(dequeued_ns=now))
            ids = to_numpy(job.inputs[0]).reshape(-1)
            request = GenRequest(
                request_id=job.request_id,
                prompt=tuple(int(i) for i in ids),
                max_new_tokens=gen.max_new_tokens,
                priority=entry.stream.priority,  # the level the router placed it on
                deadline_ns=job.deadline_ns,
                arrived_ns=job.timing.enqueued_ns or now,
                sampling=Sampling(gen.temperature, gen.top_p, gen.seed),
            )
            running = _Running(entry, job, self._service.submit(request))
            self._running[job.request_id] = running
            running.task = asyncio.create_task(
                self._generate(running), name=f"generate-{job.request_id}"
            )

    async def _generate(self, run: _Running) -> None:
        """Follow one request to its end (in a CONSUMER span of its own trace, through the
        queue); the entry is acknowledged after its answer."""
        with self._tracer.start_as_current_span(
            f"{run.entry.stream.name} generate",
            context=extract(run.job.trace_context),
            kind=SpanKind.CONSUMER,
        ) as span:
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "process")
            span.set_attribute("messaging.destination.name", run.entry.stream.name)
            span.set_attribute("tiermesh.request_id", run.job.request_id)
            result = await self._follow(run)
            if result is not None:
                for key in ("prompt_tokens", "generated_tokens", "finish_reason"):
                    if key in result.annotations:
                        span.set_attribute(f"tiermesh.{key}", result.annotations[key])

    async def _follow(self, run: _Running) -> JobResult | None:
        """The request's tokens as text, to its end; its final result (None when nobody
        waits for one), posted for hand-off."""
        job, stream = run.job, run.stream
        gen = job.generation
        assert gen is not None
        text = self._text(gen.stop)
        started = self._clock_ns()
        try:
            async for token in stream:
                piece = text.push(token)
                if text.stopped:
                    stream.cancel()
                    break
                if piece and gen.stream:
                    self._outbox.post(_piece(job, piece, len(text.text) - len(piece)))
            rest = text.finish()
            if rest and gen.stream:
                self._outbox.post(_piece(job, rest, len(text.text) - len(rest)))
        finally:
            timings = stream.timings
            end = "stop_string" if text.stopped else (timings.end if timings else "cancelled")
            if self._running.pop(job.request_id, None) is not None:
                self._room.set()
        self.generated += timings.generated_tokens if timings else 0
        if self._metrics is not None and timings is not None:
            self._metrics.finished(
                self.unit,
                end,
                timings.prompt_tokens,
                timings.generated_tokens,
                timings.ttft_ms / 1000,
                timings.tpot_ms / 1000,
            )
        if end in UNANSWERED or timings is None:
            self.cancelled += end == "cancelled"
            self._outbox.ack(run.entry)
            return None
        if end == "error":
            result = JobResult.for_job(job, code=grpc.StatusCode.INTERNAL, message=INTERNAL_MESSAGE)
        elif end.startswith("rejected:"):
            result = JobResult.for_job(
                job,
                code=grpc.StatusCode.RESOURCE_EXHAUSTED,
                message=f"the model's KV pool cannot hold this request ({end})",
            )
        else:
            result = JobResult.for_job(
                job,
                worker=self._streams.consumer,
                outputs=(text_tensor(text.text),),
                timing=job.timing.with_(batch_start_ns=started, batch_end_ns=self._clock_ns()),
                batch_size=max(1, self._service.running),
                annotations={
                    **job.annotations,
                    "prompt_tokens": str(timings.prompt_tokens),
                    "generated_tokens": str(timings.generated_tokens),
                    "ttft_ms": f"{timings.ttft_ms:.3f}",
                    "tpot_ms": f"{timings.tpot_ms:.3f}",
                    "finish_reason": FINISH.get(end, end),
                },
            )
        self._outbox.post(result, run.entry)
        return result

    # -- background loops ----------------------------------------------------------------

    async def _beat(self) -> None:
        await self._streams.heartbeat(
            [self.unit], self.tier, self._timers.heartbeat_ttl_ms, self._providers
        )

    async def _heartbeat(self) -> None:
        interval = self._timers.heartbeat_interval_ms / 1000
        while not self._leaving:
            try:
                await self._beat()
            except (aioredis.RedisError, OSError) as exc:
                log.warning("heartbeat failed", error=str(exc))
            raise_if_cancelling()
            await asyncio.sleep(interval)

    async def _watch(self) -> None:
        """Cancel the requests whose callers left (the gateway's cancel flags), and report
        the engine's load."""
        while True:
            await asyncio.sleep(self._timers.cancel_poll_ms / 1000)
            if self._metrics is not None:
                self._metrics.load(self.unit, self._service.running, self._service.reserved_tokens)
            if not self._running:
                continue
            try:
                gone = await self._streams.cancelled(list(self._running))
            except (aioredis.RedisError, OSError):
                raise_if_cancelling()
                continue
            for request_id in gone:
                running = self._running.get(request_id)
                if running is not None:
                    running.stream.cancel()

    async def _reclaim(self) -> None:
        """Keep this worker's running entries from looking abandoned, and take over what
        dead workers read and never acknowledged (poison entries are dead-lettered)."""
        while True:
            await asyncio.sleep(self._timers.reclaim_interval_ms / 1000)
            try:
                await self._touch()
                room = self._free()
                for key in self._keys:
                    if room <= 0 or self._stopping.is_set():
                        break
                    entries = await self._streams.reclaim(
                        key, self._timers.reclaim_min_idle_ms, room
                    )
                    entries = [e for e in entries if not self._is_running(e)]
                    counts = await self._streams.deliveries(key, [e.entry_id for e in entries])
                    limit = self._timers.max_deliveries
                    poison = [e for e in entries if counts.get(e.entry_id, 1) > limit]
                    for e in poison:
                        await self._give_up(e, counts[e.entry_id])
                    fresh = [e for e in entries if e not in poison]
                    if fresh:
                        log.warning("reclaimed entries of a dead worker", n=len(fresh))
                    self._take(fresh)
                    room -= len(fresh)
            except (aioredis.RedisError, OSError) as exc:
                log.warning("reclaim failed", error=str(exc))
                raise_if_cancelling()

    async def _give_up(self, entry: Entry, deliveries: int) -> None:
        """A request that ended its workers' lives too often: dead-lettered, caller told."""
        await self._streams.dead_letter(entry, f"delivered {deliveries} times")
        with contextlib.suppress(Exception):
            job = decode_job(entry.fields[keys.JOB_FIELD.encode()])
            message = f"given up after {deliveries} failed deliveries"
            self._outbox.post(JobResult.for_job(job, code=grpc.StatusCode.ABORTED, message=message))
        log.error("dead-lettered a generation request", stream=entry.stream.name)

    def _free(self) -> int:
        """Requests this worker may still take (running, or waiting in its engine)."""
        return self._limit - len(self._running)

    def _is_running(self, entry: Entry) -> bool:
        return any(r.entry.entry_id == entry.entry_id for r in self._running.values())

    async def _touch(self) -> None:
        by_stream: dict[StreamKey, list[str]] = defaultdict(list)
        for run in self._running.values():
            by_stream[run.entry.stream].append(run.entry.entry_id)
        for stream, ids in by_stream.items():
            await self._streams.touch(stream, ids)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("generation task failed", task=task.get_name(), error=repr(task.exception()))


def _piece(job: Job, text: str, offset: int) -> JobResult:
    return JobResult.for_job(job, outputs=(text_tensor(text),), partial=True, text_offset=offset)
