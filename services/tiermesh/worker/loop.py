"""The worker's async loop: it only moves data. Decisions live in batching.py, compute in
runner.py, Redis in streams.py and the hand-off in handoff.py."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

import grpc
import redis.asyncio as aioredis
import structlog
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind

from tiermesh.core import keys
from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig
from tiermesh.core.telemetry import Telemetry, extract, span_context_of
from tiermesh.core.tensors import TensorData
from tiermesh.core.wire import decode_job
from tiermesh.worker.batching import (
    QueuedJob,
    pick_stream,
    split_expired,
    take_count,
    wait_more_ms,
)
from tiermesh.worker.handoff import PostprocessClient
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.streams import Entry, StreamClient

log = structlog.get_logger("tiermesh.worker")
HANDOFF_ATTEMPTS = 5
# How often a batch that is not yet full looks for more entries while it waits.
FILL_POLL_MS = 0.5


class Worker:
    """Serves the streams of its models on one tier. `run` returns after `stop()` once
    every entry it had read is handed off (or left unacknowledged for recovery)."""

    def __init__(
        self,
        *,
        tier: str,
        configs: Mapping[str, ModelConfig],
        runners: Mapping[str, ModelRunner],  # both keyed by compute unit ("mlp.fp32")
        streams: StreamClient,
        handoff: PostprocessClient,
        telemetry: Telemetry,
        poll_block_ms: int = 200,
        heartbeat_interval_ms: int = 1000,
        heartbeat_ttl_ms: int = 10_000,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.tier = tier
        self._configs = configs
        self._runners = runners
        self._streams = streams
        self._handoff = handoff
        self._tracer = telemetry.tracer
        self._poll_block_ms = poll_block_ms
        self._hb_interval_s = heartbeat_interval_ms / 1000
        self._hb_ttl_ms = heartbeat_ttl_ms
        self._clock_ns = clock_ns
        self._keys = [
            k
            for unit, cfg in configs.items()
            for k in keys.stream_keys(unit, tier, cfg.priority_levels, cfg.bucket_count)
        ]
        self._buffer: dict[StreamKey, list[QueuedJob]] = defaultdict(list)
        self._stopping = asyncio.Event()
        # Set once the consumer groups exist and the first heartbeat is out: from then on
        # routers admit work for this worker's models.
        self.started = asyncio.Event()
        self.computed_rows = 0
        self.expired = 0

    def stop(self) -> None:
        """Stop intake: no more reads; buffered entries are still finished."""
        self._stopping.set()

    async def run(self) -> None:
        await self._streams.ensure_groups(self._keys)
        await self._streams.heartbeat(self._configs, self.tier, self._hb_ttl_ms)
        self.started.set()
        heartbeat = asyncio.create_task(self._heartbeat(), name="worker-heartbeat")
        try:
            await self._collect(await self._streams.read(self._keys, 10_000, None, pending=True))
            while not self._stopping.is_set() or self._buffered():
                if not self._buffered():
                    await self._collect(await self._read_any())
                key = pick_stream({k: len(v) for k, v in self._buffer.items()})
                if key is not None:
                    await self._fill(key)
                    await self._dispatch(key)
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
            try:
                await self._streams.leave(self._configs, self.tier)
            except (aioredis.RedisError, OSError):
                log.warning("could not deregister worker")

    def _buffered(self) -> bool:
        return any(self._buffer.values())

    async def _read_any(self) -> list[Entry]:
        count = max(max(c.max_batch_size, 1) for c in self._configs.values())
        try:
            return await self._streams.read(self._keys, count, self._poll_block_ms)
        except (aioredis.RedisError, OSError) as exc:
            log.warning("redis read failed; retrying", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            return []

    async def _fill(self, key: StreamKey) -> None:
        """Wait for more entries of this stream until the batch is full or its wait is up.

        Redis times out a blocked read only on its server tick (100 ms at the default
        hz 10), far coarser than a batch wait of a few ms, so this polls without BLOCK.
        """
        cfg = self._configs[key.model]
        max_rows = max(cfg.max_batch_size, 1)
        while not self._stopping.is_set():
            queued = self._buffer[key]
            rows = sum(q.job.rows for q in queued)
            wait = wait_more_ms(
                queued[0].dequeued_ns, self._clock_ns(), cfg.max_batch_wait_ms, rows, max_rows
            )
            if wait <= 0:
                return
            try:
                more = await self._streams.read([key], max_rows - rows, None)
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

    async def _dispatch(self, key: StreamKey) -> None:
        queued = self._buffer[key]
        cfg = self._configs[key.model]
        n = take_count([q.job.rows for q in queued], max(cfg.max_batch_size, 1))
        batch, self._buffer[key] = queued[:n], queued[n:]
        results = await self._compute(key, batch)
        await asyncio.shield(self._finish(key, batch, results))

    async def _compute(self, key: StreamKey, batch: list[QueuedJob]) -> list[JobResult]:
        live, expired = split_expired(batch, self._clock_ns())
        self.expired += len(expired)
        for q in expired:
            span = self._tracer.start_span(
                "expired",
                context=extract(q.job.trace_context),
                attributes={"tiermesh.request_id": q.job.request_id},
            )
            span.end()
        results = [
            JobResult.for_job(
                q.job,
                code=grpc.StatusCode.DEADLINE_EXCEEDED,
                message="deadline exceeded while queued; not computed",
            )
            for q in expired
        ]
        if not live:
            return results
        links = [Link(span_context_of(q.job.trace_context)) for q in batch]
        with self._tracer.start_as_current_span(
            f"{key.name} process", kind=SpanKind.CONSUMER, links=links
        ) as span:
            span.set_attribute("messaging.system", "redis")
            span.set_attribute("messaging.batch.message_count", len(live))
            start = self._clock_ns()
            try:
                outputs = await asyncio.to_thread(
                    self._runners[key.model].run, [q.job for q in live]
                )
                error = None
            except Exception as exc:
                log.exception("model execution failed", model=key.model)
                span.record_exception(exc)
                outputs, error = [], "model execution failed"
            end = self._clock_ns()
            batch_context = span.get_span_context()
        rows = sum(q.job.rows for q in live)
        if error is None:
            self.computed_rows += rows
        cfg = self._configs[key.model]
        for i, q in enumerate(live):
            self._request_spans(q, start, end, rows, batch_context)
            timing = q.job.timing.with_(batch_start_ns=start, batch_end_ns=end)
            if error is None:
                results.append(
                    JobResult.for_job(
                        q.job,
                        outputs=_public(cfg, q.job, outputs[i].outputs),
                        aux=_aux(cfg, outputs[i].padded_inputs),
                        timing=timing,
                        batch_size=rows,
                    )
                )
            else:
                results.append(
                    JobResult.for_job(
                        q.job, code=grpc.StatusCode.INTERNAL, message=error, timing=timing
                    )
                )
        return results

    def _request_spans(
        self, q: QueuedJob, start: int, end: int, rows: int, batch: trace.SpanContext
    ) -> None:
        """Per request, on its own trace: the wait in the queue and its share of compute."""
        ctx = extract(q.job.trace_context)
        if q.job.timing.routed_ns:
            wait = self._tracer.start_span(
                "queue wait", context=ctx, start_time=q.job.timing.routed_ns
            )
            wait.end(end_time=max(q.dequeued_ns, q.job.timing.routed_ns))
        compute = self._tracer.start_span(
            "compute",
            context=ctx,
            start_time=start,
            attributes={
                "tiermesh.request_id": q.job.request_id,
                "tiermesh.batch_rows": rows,
                "tiermesh.model": q.job.model,
            },
            links=[Link(batch)],
        )
        compute.end(end_time=end)

    async def _finish(
        self, key: StreamKey, batch: list[QueuedJob], results: list[JobResult]
    ) -> None:
        """Publish, then ack: entries are deleted only after postprocess took the batch.
        When the hand-off keeps failing they stay pending for recovery."""
        for attempt in range(HANDOFF_ATTEMPTS):
            try:
                await self._handoff.process(results)
                break
            except grpc.aio.AioRpcError as exc:
                log.warning("hand-off failed", attempt=attempt + 1, code=exc.code().name)
                await asyncio.sleep(min(0.1 * 2**attempt, 1.0))
        else:
            log.error("hand-off gave up; entries stay pending", stream=key.name, n=len(batch))
            return
        try:
            await self._streams.done(key, [q.entry_id for q in batch])
        except (aioredis.RedisError, OSError):
            log.error("ack failed; entries will be delivered again", stream=key.name)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await self._streams.heartbeat(self._configs, self.tier, self._hb_ttl_ms)
            except (aioredis.RedisError, OSError) as exc:
                log.warning("heartbeat failed", error=str(exc))
            await asyncio.sleep(self._hb_interval_s)


def _public(cfg: ModelConfig, job: Job, outputs: tuple[TensorData, ...]) -> tuple[TensorData, ...]:
    """Outputs the caller asked for; a model that postprocesses hands on all of them."""
    if cfg.compute_outputs or not job.requested_outputs:
        return outputs
    return tuple(o for o in outputs if o.name in job.requested_outputs)


def _aux(cfg: ModelConfig, padded: tuple[TensorData, ...]) -> tuple[TensorData, ...]:
    """The inputs a postprocess step needs (the pooling mask), as padded for the batch."""
    if cfg.pool is None:
        return ()
    return tuple(t for t in padded if t.name == cfg.pool.mask)
