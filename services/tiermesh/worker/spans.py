"""The worker's spans: its batch span's links to the requests it computed, and the span of a
request dropped before compute. A computed request's queue-wait and compute spans are built by
its gateway from the request's timing (gateway/hop_spans.py): no span per request here."""

from __future__ import annotations

from opentelemetry.trace import Link

from tiermesh.core.telemetry import Telemetry, extract, parse_traceparent
from tiermesh.worker.batching import QueuedJob


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
    if not telemetry.exporting:
        return []
    parents = (parse_traceparent(q.job.trace_context.get("traceparent", "")) for q in batch)
    return [Link(p) for p in parents if p is not None and p.trace_flags.sampled]
