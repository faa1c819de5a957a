"""The worker's async loop: it only moves data. Decisions live in scheduler.py and
batching.py, compute in runner.py, Redis in streams.py and the hand-off in handoff.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import grpc
import redis.asyncio as aioredis
import structlog
from opentelemetry.trace import Link, SpanKind

from tiermesh.core import keys
from tiermesh.core.control_watch import ControlState
from tiermesh.core.jobs import JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig
from tiermesh.core.serving import plan_units, worker_units
from tiermesh.core.telemetry import Telemetry, span_context_of
from tiermesh.core.wire import decode_job, encode_job
from tiermesh.worker import results
from tiermesh.worker.background import BackgroundResults, job_of
from tiermesh.worker.batching import (
    QueuedJob,
    split_cancelled,
    split_expired,
    take_count,
    view_of,
)
from tiermesh.worker.cascade import escalates
from tiermesh.worker.handoff import PostprocessClient, retrying
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.runner import JobOutputs, ModelRunner
from tiermesh.worker.scheduler import Scheduler, is_background
from tiermesh.worker.spans import request_spans, skipped_span
from tiermesh.worker.streams import Entry, StreamClient
from tiermesh.worker.units import UnitControl

log = structlog.get_logger("tiermesh.worker")
# How often a batch that is not yet full looks for more entries while it waits.
FILL_POLL_MS = 0.5
MAX_HANDOFFS_IN_FLIGHT = 2
# While a paced background batch is still being written, reads block at most this long.
PACE_POLL_MS = 5
# Weight of the newest batch in a stream's measured drain rate.
RATE_ALPHA = 0.3


class Worker:
    """Serves the streams of its models on one tier. `run` returns after `stop()` once
    every entry it had read is handed off (or left unacknowledged for recovery)."""

    def __init__(
        self,
        *,
        tier: str,
        configs: Mapping[str, ModelConfig],
        runners: Mapping[str, ModelRunner],  # both keyed by compute unit ("mlp@1.fp32")
        streams: StreamClient,
        handoff: PostprocessClient,
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
        background_duty: float = 1.0,
        online: bool = True,
    ) -> None:
        # False: a batch pool worker, reading only background streams and never registered
        # for online admission (no heartbeat), so routers never count on it.
        self._online = online
        # Batch-job work (background streams): read, computed in the gaps of online work
        # and written into its job; None: this worker takes none.
        self._background = background
        self._reclaim_interval_s = reclaim_interval_ms / 1000
        self._reclaim_min_idle_ms = reclaim_min_idle_ms
        self._max_deliveries = max_deliveries
        self.tier = tier
        self._metrics = metrics
        # Units with a session: those served, and those closing (unloaded through model
        # control: no longer read, finishing what was read). Changed by `apply`.
        self._configs = dict(configs)
        self._runners = dict(runners)
        self._closing: set[str] = set()
        # Closing units whose queued entries are being answered (not retired meanwhile).
        self._draining: set[str] = set()
        self._control = control
        self._streams = streams
        self._handoff = handoff
        self._tracer = telemetry.tracer
        self._poll_block_ms = poll_block_ms
        self._hb_interval_s = heartbeat_interval_ms / 1000
        self._hb_ttl_ms = heartbeat_ttl_ms
        self._clock_ns = clock_ns
        self._scheduler = Scheduler(configs, background_share, background_duty)
        self._keys = self._stream_keys()
        self._buffer: dict[StreamKey, list[QueuedJob]] = defaultdict(list)
        self._rates: dict[StreamKey, float] = {}
        self._last_dispatch: dict[StreamKey, int] = {}
        # Hand-offs in flight: the next batch computes while the last one is delivered.
        self._finishing: set[asyncio.Task[None]] = set()
        self._handoff_slots = asyncio.Semaphore(MAX_HANDOFFS_IN_FLIGHT)
        self._stopping = asyncio.Event()
        self._leaving = False
        # Set once the consumer groups exist and the first heartbeat is out: from then on
        # routers admit work for this worker's models.
        self.started = asyncio.Event()
        self.computed_rows = 0
        self.expired = 0
        self.cancelled = 0
        self.cascaded = 0
        self.reclaimed = 0
        self.dead_lettered = 0

    def stop(self) -> None:
        """Stop intake: no more reads; buffered entries are still finished."""
        self._stopping.set()

    @property
    def serving(self) -> list[str]:
        """The units this worker reads and heartbeats for."""
        return [u for u in self._configs if u not in self._closing]

    def _stream_keys(self) -> list[StreamKey]:
        online = [
            k
            for unit in self.serving
            if self._online
            for k in keys.stream_keys(
                unit,
                self.tier,
                self._configs[unit].priority_levels,
                self._configs[unit].bucket_count,
            )
        ]
        if self._background is None:
            return online
        return online + [
            k
            for unit in self.serving
            for k in keys.background_streams(unit, self.tier, self._configs[unit].bucket_count)
        ]

    async def run(self) -> None:
        await self._streams.ensure_groups(self._keys)
        await self._beat(self.serving)
        self.started.set()
        for unit in self.serving:
            self._unit_metric(unit, True)
        heartbeat = asyncio.create_task(self._heartbeat(), name="worker-heartbeat")
        reclaimer = asyncio.create_task(self._reclaim(), name="worker-reclaimer")
        owned = [heartbeat, reclaimer]
        if self._control is not None:
            watch = self._control.watch.run(self._control.interval_s, self.apply)
            owned.append(asyncio.create_task(watch, name="worker-model-control"))
        try:
            await self._collect(await self._streams.read(self._keys, 10_000, None, pending=True))
            while not self._stopping.is_set() or self._buffered():
                await self._retire()
                if not self._stopping.is_set():
                    await self._collect(await self._read_any(self._block_ms()))
                await self._sweep_expired()
                views = [view_of(k, q) for k, q in self._buffer.items() if q]
                key = self._scheduler.pick(views, self._clock_ns())
                if key is not None:
                    await self._fill(key)
                    await self._dispatch(key)
        finally:
            # Hand-offs are never cancelled: publish, then ack, even while stopping.
            await asyncio.gather(*self._finishing, return_exceptions=True)
            for task in owned:
                task.cancel()
            await asyncio.gather(*owned, return_exceptions=True)
            try:
                await self._streams.leave(self._configs, self.tier)
            except (aioredis.RedisError, OSError):
                log.warning("could not deregister worker")

    def _buffered(self) -> bool:
        return any(self._buffer.values())

    def _block_ms(self) -> int | None:
        """How long the next read may block: while idle, the poll; while online work is
        buffered, not at all (just look for newer, maybe more urgent work); while only
        paced background work is (scheduler.background_wait_ms), until its pause ends."""
        if not self._buffered():
            return self._poll_block_ms
        if any(q for k, q in self._buffer.items() if not is_background(k)):
            return None
        wait = self._scheduler.background_wait_ms(self._clock_ns())
        if wait <= 0:
            return None
        wait = PACE_POLL_MS if math.isinf(wait) else math.ceil(wait)
        return max(1, min(self._poll_block_ms, wait))  # BLOCK 0 would block for ever

    def _room(self, key: StreamKey) -> int:
        """Rows a stream's buffer may still take: two batches' worth, no more, so unread
        work stays in Redis where other workers can take it."""
        limit = 2 * self._configs[key.model].bucket(key.bucket).max_batch_size
        return limit - sum(q.job.rows for q in self._buffer[key])

    async def _read_any(self, block_ms: int | None) -> list[Entry]:
        wanted = [k for k in self._keys if self._room(k) > 0]
        count = max((self._room(k) for k in wanted), default=0)
        if not wanted:
            if block_ms:  # nothing to read (every unit unloaded, or paced): idle, not spinning
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), block_ms / 1000)
            return []
        try:
            return await self._streams.read(wanted, count, block_ms)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("redis read failed; retrying", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            return []

    async def _fill(self, key: StreamKey) -> None:
        """Wait for more entries of this stream until the scheduler closes the batch.

        Redis times out a blocked read only on its server tick (100 ms at the default
        hz 10), far coarser than a batch wait of a few ms, so this polls without BLOCK.
        """
        while not self._stopping.is_set() and key.model not in self._closing:
            wait = self._scheduler.wait_ms(view_of(key, self._buffer[key]), self._clock_ns())
            room = self._room(key)
            if wait <= 0 or room <= 0:
                return
            try:
                more = await self._streams.read([key], room, None)
            except (aioredis.RedisError, OSError):
                return
            if more:
                await self._collect(more)
            else:
                await asyncio.sleep(min(wait, FILL_POLL_MS) / 1000)

    async def _collect(self, entries: Sequence[Entry]) -> None:
        now = self._clock_ns()
        for e in entries:
            try:
                job = decode_job(e.fields[keys.JOB_FIELD.encode()])
            except Exception:
                # Undecodable entries can never succeed: drop them rather than loop on them.
                log.error("undecodable stream entry dropped", stream=e.stream.name, id=e.entry_id)
                await self._streams.done(e.stream, [e.entry_id])
                continue
            job = dataclasses.replace(job, timing=job.timing.with_(dequeued_ns=now))
            self._buffer[e.stream].append(QueuedJob(e.stream, e.entry_id, job, now))
            self._scheduler.arrived(e.stream, job.rows, now)

    async def _dispatch(self, key: StreamKey) -> None:
        queued = self._buffer[key]
        rows = self._scheduler.batch_rows(view_of(key, queued))
        n = take_count([q.job.rows for q in queued], rows)
        batch, self._buffer[key] = queued[:n], queued[n:]
        started = self._clock_ns()
        # How long this batch waited for its turn since the stream's previous batch (not
        # counting time the stream sat idle), for the drain rate.
        arrived = min(q.job.timing.routed_ns or q.dequeued_ns for q in batch) if batch else started
        interval = started - max(self._last_dispatch.get(key, started), arrived)
        self._last_dispatch[key] = started
        await self._handoff_slots.acquire()
        background = is_background(key)
        if background:
            self._scheduler.background_started()
        try:
            live, done = await self._compute(key, batch)
        except BaseException:
            self._released(background, started)
            raise
        if not live and not done:
            self._released(background, started)
            return
        task = asyncio.create_task(self._finish(key, live, done, started, interval))
        self._finishing.add(task)
        # The slot (and, for background work, pacing) is freed once its results are
        # handed off or written (or given up).
        task.add_done_callback(lambda t: self._finished(t, background, started))

    def _released(self, background: bool, started: int) -> None:
        """A dispatched batch is done with: its hand-off slot is free, and a background
        batch's span counts for pacing."""
        self._handoff_slots.release()
        if background:
            self._scheduler.background_done(started, self._clock_ns())

    def _finished(self, task: asyncio.Task[None], background: bool, started: int) -> None:
        self._finishing.discard(task)
        self._released(background, started)
        if not task.cancelled() and task.exception() is not None:
            log.error("hand-off task failed", error=repr(task.exception()))

    async def _sweep_expired(self) -> None:
        """Drop buffered entries whose deadline has passed, before they count for aging or
        a batch. Their callers were answered DEADLINE_EXCEEDED by their gateway already."""
        now = self._clock_ns()
        for key, queued in self._buffer.items():
            live, expired = split_expired(queued, now)
            if expired:
                self._buffer[key] = live
                await self._drop(key, expired, "expired")

    async def _skip(self, key: StreamKey, batch: list[QueuedJob]) -> list[QueuedJob]:
        """Drop what must not be computed: expired requests and those whose caller left.
        Nobody waits for their answer (the gateway answered the expired ones itself), so
        they are acknowledged at once and never handed off."""
        live, expired = split_expired(batch, self._clock_ns())
        try:
            gone = await self._streams.cancelled([q.job.request_id for q in live])
        except (aioredis.RedisError, OSError):
            gone = set()
        live, cancelled = split_cancelled(live, gone)
        if self._background is not None and is_background(key):
            try:
                live, dropped = await self._background.split_cancelled(live)
                cancelled += dropped
            except (aioredis.RedisError, OSError):
                pass  # computed; the job refuses the results if it was cancelled
        await self._drop(key, expired, "expired")
        await self._drop(key, cancelled, "cancelled")
        return live

    async def _drop(self, key: StreamKey, queued: list[QueuedJob], reason: str) -> None:
        if not queued:
            return
        if reason == "expired":
            self.expired += len(queued)
        else:
            self.cancelled += len(queued)
        if self._metrics is not None:
            self._metrics.skip(key, reason, len(queued))
        for q in queued:
            skipped_span(self._tracer, q, reason)
        try:
            await self._streams.done(key, [q.entry_id for q in queued])
        except (aioredis.RedisError, OSError):
            log.warning("could not drop skipped entries; they come back", stream=key.name)

    async def _compute(
        self, key: StreamKey, batch: list[QueuedJob]
    ) -> tuple[list[QueuedJob], list[JobResult]]:
        """The batch's live requests and their results (skipped ones dropped on the way)."""
        live = await self._skip(key, batch)
        done: list[JobResult] = []
        if not live:
            return live, done
        rows = sum(q.job.rows for q in live)
        links = [Link(span_context_of(q.job.trace_context)) for q in live]
        with self._tracer.start_as_current_span(
            f"{key.name} process", kind=SpanKind.CONSUMER, links=links
        ) as span:
            # OpenTelemetry messaging conventions for a batch: one span, a link per message.
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.operation.type", "process")
            span.set_attribute("messaging.destination.name", key.name)
            span.set_attribute("messaging.consumer.group.name", keys.GROUP)
            span.set_attribute("messaging.batch.message_count", len(live))
            start = self._clock_ns()
            try:
                outputs = await asyncio.to_thread(
                    self._runners[key.model].run, [q.job for q in live]
                )
            except Exception as exc:
                log.warning("batch failed; running its requests one by one", model=key.model)
                span.record_exception(exc)
                live, outputs, poison = await self._isolate(key, live)
                done.extend(await self._poisoned(poison))
                rows = sum(q.job.rows for q in live)
            end = self._clock_ns()
            batch_context = span.get_span_context()
        if not live:
            return live, done
        self.computed_rows += rows
        self._scheduler.observe(key, rows, end - start)
        cfg = self._configs[key.model]
        for q, out in zip(live, outputs, strict=True):
            request_spans(self._tracer, q, start, end, rows, batch_context)
            confidence = escalates(cfg, key.tier, out.outputs)
            if confidence is not None and await self._cascade(cfg, q, confidence):
                continue
            done.append(results.computed(cfg, q, out, start, end, rows, self._streams.consumer))
        if self._metrics is not None:
            tokens = sum(int(r.annotations.get("tokens", 0)) for r in done)
            padded = sum(int(r.annotations.get("padded_tokens", 0)) for r in done)
            self._metrics.batch(key, rows, end - start, tokens, padded)
        return live, done

    async def _isolate(
        self, key: StreamKey, batch: list[QueuedJob]
    ) -> tuple[list[QueuedJob], list[JobOutputs], list[QueuedJob]]:
        """After a batch failed: each request alone, so one poison request cannot fail the
        others. Returns (computed, their outputs, the ones that fail even alone)."""
        ok: list[QueuedJob] = []
        outputs: list[JobOutputs] = []
        poison: list[QueuedJob] = []
        for q in batch:
            try:
                outputs.extend(await asyncio.to_thread(self._runners[key.model].run, [q.job]))
                ok.append(q)
            except Exception:
                poison.append(q)
        return ok, outputs, poison

    async def _poisoned(self, poison: list[QueuedJob]) -> list[JobResult]:
        """Requests the model fails on: dead-lettered at once (retrying cannot help), their
        callers told ABORTED."""
        out = []
        for q in poison:
            entry = Entry(q.stream, q.entry_id, {keys.JOB_FIELD.encode(): encode_job(q.job)})
            try:
                await self._streams.dead_letter(entry, "model execution failed on this request")
            except (aioredis.RedisError, OSError):
                log.warning("could not dead-letter a poison request", stream=q.stream.name)
            self.dead_lettered += 1
            out.append(
                results.failed(q, grpc.StatusCode.ABORTED, "the model fails on this request")
            )
        if poison:
            log.error("poison requests dead-lettered", n=len(poison))
        return out

    async def _cascade(self, cfg: ModelConfig, q: QueuedJob, confidence: float) -> bool:
        """Send a job whose edge answer was not confident enough to the last tier; True when
        it went (its answer then comes from there, marked as cascaded)."""
        last = cfg.tiers[-1]
        job = dataclasses.replace(
            q.job,
            tier=last.name,
            variant=last.variant or cfg.default_variant,
            annotations={
                **q.job.annotations,
                "cascaded": "true",
                "edge_confidence": f"{confidence:.4f}",
            },
        )
        target = StreamKey(
            # The same version on the last tier: a cascade never changes what computes it.
            keys.compute_unit(cfg.queue_model, job.variant, keys.split_unit(q.stream.model)[1]),
            last.name,
            job.priority,
            job.bucket,
        )
        try:
            sent = await self._streams.requeue(target, encode_job(job), dict(job.trace_context))
        except (aioredis.RedisError, OSError):
            sent = False
        if sent:
            self.cascaded += 1
        return sent

    async def _finish(
        self,
        key: StreamKey,
        batch: list[QueuedJob],
        done: list[JobResult],
        started: int,
        interval: int,
    ) -> None:
        """Publish, then ack: entries are deleted only after postprocess took the batch.
        When the hand-off keeps failing they stay pending for recovery. (With nothing to
        hand off - every request cascaded to another tier - it only acknowledges.)
        Batch-job results go into their job instead (worker/background.py)."""
        background = self._background
        if background is not None and is_background(key):
            # Written once all the same when computed again after Redis stayed away.
            if not await retrying(
                lambda: background.write(done),
                (aioredis.RedisError, OSError),
                "batch results not written",
            ):
                log.error("batch results gave up; entries stay pending", stream=key.name)
                return
        elif done and not await retrying(
            lambda: self._handoff.process(done), (grpc.aio.AioRpcError,), "hand-off failed"
        ):
            log.error("hand-off gave up; entries stay pending", stream=key.name, n=len(batch))
            return
        rate = self._drain_rate(key, len(batch), max(self._clock_ns() - started, interval))
        try:
            await self._streams.done(key, [q.entry_id for q in batch], rate)
        except (aioredis.RedisError, OSError):
            log.error("ack failed; entries will be delivered again", stream=key.name)

    def _drain_rate(self, key: StreamKey, entries: int, period_ns: int) -> float:
        """Entries per second this stream drains at (EWMA), for admission. The period is the
        batch's own service time or, when the stream waited its turn behind others, the time
        since its previous batch: what a newcomer to this queue really sees."""
        rate = entries / max(period_ns / 1e9, 1e-6)
        old = self._rates.get(key)
        self._rates[key] = rate if old is None else RATE_ALPHA * rate + (1 - RATE_ALPHA) * old
        return self._rates[key]

    async def _reclaim(self) -> None:
        """Take over what dead workers read and never acknowledged. An entry delivered more
        than max_deliveries times is poison: dead-lettered, its caller told ABORTED."""
        while True:
            await asyncio.sleep(self._reclaim_interval_s)
            for key in self._keys:
                if key.model not in self.serving or self._stopping.is_set():
                    continue  # unloaded meanwhile
                room = self._room(key)
                if room <= 0:
                    continue
                try:
                    entries = await self._streams.reclaim(key, self._reclaim_min_idle_ms, room)
                    mine = {q.entry_id for q in self._buffer[key]}
                    entries = [e for e in entries if e.entry_id not in mine]
                    counts = await self._streams.deliveries(key, [e.entry_id for e in entries])
                except (aioredis.RedisError, OSError) as exc:
                    log.warning("reclaim failed", stream=key.name, error=str(exc))
                    continue
                poison = [e for e in entries if counts.get(e.entry_id, 1) > self._max_deliveries]
                fresh = [e for e in entries if e not in poison]
                if poison:
                    await self._give_up(poison, counts)
                if fresh:
                    self.reclaimed += len(fresh)
                    log.warning("reclaimed entries of a dead worker", stream=key.name, n=len(fresh))
                    await self._collect(fresh)

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
            with contextlib.suppress(aioredis.RedisError, OSError):
                await self._background.write(answers)
            answers = [a for a in answers if job_of(a.annotations) is None]
        if answers:
            try:
                await self._handoff.process(answers)
            except grpc.aio.AioRpcError as exc:
                log.warning("could not tell callers of dead-lettered entries", code=exc.code().name)

    async def leave(self) -> None:
        """First stage of a graceful stop: stop heartbeating and deregister, so routers send
        nothing more here, while intake goes on (what was routed here meanwhile still gets
        read). Call `stop()` after a short window."""
        self._leaving = True
        try:
            await self._streams.leave(self._configs, self.tier)
        except (aioredis.RedisError, OSError):
            log.warning("could not deregister worker")

    async def _beat(self, units: list[str]) -> None:
        """Register `units` as served here for online admission (not from a batch pool)."""
        if self._online:
            await self._streams.heartbeat(units, self.tier, self._hb_ttl_ms)

    async def _heartbeat(self) -> None:
        while not self._leaving:
            try:
                await self._beat(self.serving)
            except (aioredis.RedisError, OSError) as exc:
                log.warning("heartbeat failed", error=str(exc))
            await asyncio.sleep(self._hb_interval_s)

    # -- model control ------------------------------------------------------------------

    async def apply(self, state: ControlState) -> None:
        """Match the served set (called by the control watch with each new state, the
        repository already re-read): open the units wanted and not open, close those open
        and no longer wanted. A unit whose files do not check is not opened (logged)."""
        assert self._control is not None
        configs = self._control.repo.configs
        wanted = worker_units(configs, self._control.names, state.unloaded)
        plan = plan_units(wanted, self.serving, self._closing)
        if not plan:
            return
        for unit in plan.close:
            await self._close(unit)
        for unit in plan.reopen:
            self._closing.discard(unit)
            log.info("model loaded again while closing; kept", unit=unit)
        for unit in plan.open:
            try:
                runner = await asyncio.to_thread(self._control.open, unit, wanted[unit])
            except Exception as exc:  # a bad checksum, or a model onnxruntime refuses
                log.error("model not loaded", unit=unit, problem=str(exc))
                continue
            self._configs[unit], self._runners[unit] = wanted[unit], runner
            log.info("model loaded", unit=unit, load_s=round(runner.load_s, 3))
        self._scheduler.set_units(self._configs)
        if self._background is not None:
            self._background.set_units(self._configs)
        self._keys = self._stream_keys()
        opened = [u for u in (*plan.open, *plan.reopen) if u in self.serving]
        if opened:
            # Groups first, then the heartbeat: from then on routers admit work for them.
            await self._streams.ensure_groups(k for k in self._keys if k.model in opened)
            await self._beat(opened)
            for unit in opened:
                self._unit_metric(unit, True)

    async def _close(self, unit: str) -> None:
        """Stop reading the unit's streams and heartbeating for it, deregister, and answer
        what is still queued for it UNAVAILABLE (nobody would compute it). What was read is
        computed; the main loop drops the session once that is done (`_retire`)."""
        self._closing.add(unit)
        self._keys = self._stream_keys()
        await self._streams.leave([unit], self.tier)
        buffered = sum(len(q) for k, q in self._buffer.items() if k.model == unit)
        log.info("model unloading", unit=unit, buffered=buffered)
        cfg = self._configs[unit]
        streams = keys.stream_keys(unit, self.tier, cfg.priority_levels, cfg.bucket_count)
        model, version, _ = keys.split_unit(unit)
        message = f"model '{model}' version {version} was unloaded before this request ran"
        self._draining.add(unit)
        try:
            await self._answer_queued(unit, streams, message)
        finally:
            self._draining.discard(unit)

    async def _answer_queued(self, unit: str, streams: list[StreamKey], message: str) -> None:
        while entries := await self._streams.read(streams, 256, None):
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

    async def _retire(self) -> None:
        """Drop the sessions of closing units once nothing read for them is left (called
        by the main loop between batches, so no batch of theirs is computing)."""
        idle = [u for u in self._closing if u not in self._draining]
        for unit in [u for u in idle if not self._buffered_for(u)]:
            self._closing.discard(unit)
            for key in [k for k in self._buffer if k.model == unit]:
                del self._buffer[key]
            del self._configs[unit], self._runners[unit]
            self._scheduler.set_units(self._configs)
            self._unit_metric(unit, False)
            log.info("model unloaded; session closed", unit=unit, tier=self.tier)
            try:  # again: a heartbeat sent while closing may have landed after the first
                await self._streams.leave([unit], self.tier)
            except (aioredis.RedisError, OSError):
                log.warning("could not deregister an unloaded model", unit=unit)

    def _buffered_for(self, unit: str) -> bool:
        return any(q for k, q in self._buffer.items() if k.model == unit)

    def _unit_metric(self, unit: str, loaded: bool) -> None:
        if self._metrics is not None:
            self._metrics.unit_loaded(unit, self.tier, loaded)
