"""The worker's executor: one batch on onnxruntime off the event loop, under one CONSUMER
span that links to its requests (their own spans are the gateway's, from their timing). A
failing batch is run again request by request, so a poison request (one the model fails on)
is dead-lettered alone; an edge answer not confident enough cascades to the last tier (the
decision is worker/cascade.py's)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import structlog
from opentelemetry.trace import SpanKind

from tiermesh.core import keys
from tiermesh.core.jobs import JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig
from tiermesh.core.telemetry import Telemetry, traceparent_of
from tiermesh.core.wire import encode_job
from tiermesh.worker import results
from tiermesh.worker.batching import QueuedJob
from tiermesh.worker.cascade import escalates
from tiermesh.worker.lanes import ComputeThreads
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.runner import JobOutputs
from tiermesh.worker.scheduler import Scheduler
from tiermesh.worker.served import ServedUnits
from tiermesh.worker.spans import batch_links
from tiermesh.worker.streams import STREAM_ERRORS, Entry, WorkStreams

log = structlog.get_logger("tiermesh.worker")


class Executor:
    """Computes the batches the loop dispatches, one at a time (the loop awaits each)."""

    def __init__(
        self,
        *,
        streams: WorkStreams,
        units: ServedUnits,
        scheduler: Scheduler,
        clock_ns: Callable[[], int],
        telemetry: Telemetry,
        metrics: WorkerMetrics | None,
        threads: ComputeThreads,
    ) -> None:
        self._streams = streams
        self._threads = threads
        self._units = units
        self._scheduler = scheduler
        self._clock_ns = clock_ns
        self._telemetry = telemetry
        self._metrics = metrics
        self.computed_rows = 0
        self.inline_batches = 0  # computed on the loop's thread
        self.cascaded = 0
        self.dead_lettered = 0

    async def run(
        self, key: StreamKey, live: list[QueuedJob], inline: bool = False
    ) -> tuple[list[QueuedJob], list[JobResult]]:
        """Compute `live` (requests of one stream, none to skip): in a thread, or with
        `inline` on the loop's own thread (worker/lanes.py `run_inline`; a failing batch is
        isolated in threads all the same). Returns the requests whose
        entries are to be acknowledged after the hand-off (those computed, cascaded ones
        included) and the results to hand off (their answers, and ABORTED for poison
        requests, whose entries went to the dead letters already)."""
        done: list[JobResult] = []
        if not live:
            return live, done
        rows = sum(q.job.rows for q in live)
        links = batch_links(self._telemetry, live)
        with self._telemetry.tracer.start_as_current_span(
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
                runner, jobs = self._units.runners[key.unit], [q.job for q in live]
                if inline:
                    self.inline_batches += 1
                    outputs = runner.run(jobs, alone=True)
                else:
                    outputs = await self._threads.call(key.priority, runner.run, jobs)
            except Exception as exc:
                log.warning("batch failed; running its requests one by one", model=key.unit)
                span.record_exception(exc)
                live, outputs, poison = await self._isolate(key, live)
                done.extend(await self._poisoned(poison))
                rows = sum(q.job.rows for q in live)
            end = self._clock_ns()
            # The requests' own spans are the gateway's, from their timing: each compute span
            # links back to this batch.
            traceparent = traceparent_of(span.get_span_context()) if span.is_recording() else ""
        if not live:
            return live, done
        self.computed_rows += rows
        self._scheduler.observe(key, rows, end - start, inline)
        cfg = self._units.configs[key.unit]
        for q, out in zip(live, outputs, strict=True):
            confidence = escalates(cfg, key.tier, out.outputs) if q.job.controls.cascade else None
            if confidence is not None and await self._cascade(cfg, q, confidence):
                continue
            result = results.computed(cfg, q, out, start, end, rows, self._streams.consumer)
            done.append(result.with_(batch_traceparent=traceparent) if traceparent else result)
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
        run = self._units.runners[key.unit].run
        for q in batch:
            try:
                outputs.extend(await self._threads.call(key.priority, run, [q.job]))
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
            except STREAM_ERRORS:
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
        job = q.job.with_(
            tier=last.name,
            variant=cfg.variant_for("", last),
            annotations={
                **q.job.annotations,
                "cascaded": "true",
                "edge_confidence": f"{confidence:.4f}",
            },
        )
        target = StreamKey(
            # The same version on the last tier: a cascade never changes what computes it.
            cfg.unit(q.stream.unit.version, job.variant),
            last.name,
            job.priority,
            job.bucket,
        )
        try:
            sent = await self._streams.requeue(target, encode_job(job), dict(job.trace_context))
        except STREAM_ERRORS:
            sent = False
        if sent:
            self.cascaded += 1
        return sent
