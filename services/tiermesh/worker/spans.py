"""The worker's spans on each request's own trace (the batch span lives on its own)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Link

from tiermesh.core.telemetry import Telemetry, extract, span_context_of
from tiermesh.worker.batching import QueuedJob


def request_spans(
    telemetry: Telemetry,
    q: QueuedJob,
    start: int,
    end: int,
    rows: int,
    batch: trace.SpanContext,
) -> None:
    """The wait in the queue and the request's share of a batch's compute (only where the
    request's trace is recorded: any other request costs no span)."""
    if not telemetry.traces(q.job.trace_context):
        return
    tracer = telemetry.tracer
    ctx = extract(q.job.trace_context)
    if q.job.timing.routed_ns:
        wait = tracer.start_span("queue wait", context=ctx, start_time=q.job.timing.routed_ns)
        wait.end(end_time=max(q.dequeued_ns, q.job.timing.routed_ns))
    compute = tracer.start_span(
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


def skipped_span(telemetry: Telemetry, q: QueuedJob, reason: str) -> None:
    """A request dropped before compute ("expired", "cancelled"): the trace says why."""
    if not telemetry.traces(q.job.trace_context):
        return
    span = telemetry.tracer.start_span(
        reason,
        context=extract(q.job.trace_context),
        attributes={"tiermesh.request_id": q.job.request_id},
    )
    span.end()


def batch_links(telemetry: Telemetry, batch: list[QueuedJob]) -> list[Link]:
    """The batch span's links: one per request whose trace is recorded here."""
    return [
        Link(span_context_of(q.job.trace_context))
        for q in batch
        if telemetry.traces(q.job.trace_context)
    ]
