"""A traced request's spans after the gateway (route, queue wait, compute, postprocess,
deliver), written once, by its gateway, when the call has its result: from the instants each
hop recorded in the request's timing, each span under the resource of the service it stands
for (marked `tiermesh.reported_by`).

The hops themselves write no span per request: a span costs its process ~40 us to build and
encode, and every process that exports pays its own exporter; written here they cost one
process and one exporter (DESIGN.md, "What a request may cost"). The route span's id is
chosen when the job is built, so everything downstream continues from it: the worker's batch
span links to it, a request dropped in the queue gets its `expired` span under it, and the
result says which batch computed it, for the compute span's link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status

from tiermesh.core.jobs import JobResult
from tiermesh.core.telemetry import Telemetry, parse_traceparent, traceparent_of


@dataclass(frozen=True, slots=True)
class Hops:
    """The span ids of one traced request: its gateway span, and the route span chosen
    before the job leaves (the context the job carries downstream)."""

    root: SpanContext
    route: SpanContext
    spans: HopSpans

    def carrier(self) -> dict[str, str]:
        """The W3C context the job takes downstream: the route span's (with the caller's
        tracestate, if any)."""
        carrier = {"traceparent": traceparent_of(self.route)}
        if self.route.trace_state:
            carrier["tracestate"] = self.route.trace_state.to_header()
        return carrier

    def placed(
        self, stream: str, entry_id: str, began_ns: int, ended_ns: int, by_door: bool = False
    ) -> TracedPlacement:
        return TracedPlacement(self, stream, entry_id, began_ns, ended_ns, by_door)


@dataclass(frozen=True, slots=True)
class TracedPlacement:
    """A traced request once the router placed it: the stream entry, and when the route
    call began and ended on the gateway's clock (the route span's times when no result
    says the router's)."""

    hops: Hops
    stream: str
    entry_id: str
    began_ns: int
    ended_ns: int
    # The front door queued the job itself (core/direct_plan.py): the route span is the
    # gateway's, not the router's.
    by_door: bool = False

    def write(self, result: JobResult | None) -> None:
        """The request's hop spans, as far as `result` says it went (None: no answer)."""
        self.hops.spans.write(self, result)


class HopSpans:
    """Owned by the data plane; writes through the gateway's span processors."""

    def __init__(self, telemetry: Telemetry) -> None:
        self._telemetry = telemetry
        self._router = telemetry.hop_resource("router")
        self._worker = telemetry.hop_resource("worker")
        self._postprocess = telemetry.hop_resource("postprocess")
        self._gateway = telemetry.provider.resource

    @property
    def exporting(self) -> bool:
        return self._telemetry.exporting

    def choose(self, root: SpanContext) -> Hops:
        """The ids of a request traced under `root`, chosen before its job is built."""
        return Hops(root, self._child_of(root), self)

    def write(self, placed: TracedPlacement, result: JobResult | None) -> None:
        """The route span, and where the result came back the spans of the hops it went
        through, each covering the instants its hop recorded."""
        hops = placed.hops
        t = result.timing if result is not None else None
        finished = self._telemetry.finished
        spans: list[ReadableSpan] = [
            finished(
                "route",
                hops.route,
                hops.root,
                self._gateway if placed.by_door else self._router,
                (t.routed_ns if t else 0) or placed.began_ns,
                (t.enqueued_ns if t else 0) or placed.ended_ns,
                SpanKind.PRODUCER,
                {
                    "messaging.system": "redis",
                    "messaging.operation.type": "send",
                    "messaging.destination.name": placed.stream,
                    "messaging.message.id": placed.entry_id,
                },
            )
        ]
        if result is not None and t is not None:
            batch = parse_traceparent(result.batch_traceparent)
            # A result with no output step left skipped postprocess: its worker handed it on.
            postprocess = self._worker if result.direct else self._postprocess
            stages = (
                ("queue wait", self._worker, t.enqueued_ns, t.dequeued_ns),
                ("compute", self._worker, t.batch_start_ns, t.batch_end_ns),
                ("postprocess", postprocess, t.batch_end_ns, t.postprocessed_ns),
                ("deliver", self._gateway, t.postprocessed_ns, t.delivered_ns),
            )
            for name, resource, start, end in stages:
                if not (start and end):
                    continue  # a stage the request did not go through (a failed batch)
                computed = name == "compute"
                spans.append(
                    finished(
                        name,
                        self._child_of(hops.root),
                        hops.route,
                        resource,
                        start,
                        end,
                        attributes={
                            "tiermesh.batch_rows": result.batch_size,
                            "tiermesh.worker": result.worker,
                        }
                        if computed
                        else None,
                        links=[Link(batch)] if computed and batch is not None else (),
                    )
                )
        self._telemetry.emit(spans)

    def served(
        self,
        name: str,
        hops: Hops,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        status: Status | None,
    ) -> None:
        """The SERVER span of a call the front door answered (gateway/books.py), with the
        ids the door chose, under the gateway's resource (CallSpans writes the gateway's own)."""
        span = self._telemetry.finished(
            name,
            hops.root,
            parent,
            self._gateway,
            start_ns,
            end_ns,
            SpanKind.SERVER,
            attributes,
            status=status,
        )
        self._telemetry.emit([span])

    def _child_of(self, root: SpanContext) -> SpanContext:
        return SpanContext(
            root.trace_id, self._telemetry.new_span_id(), False, root.trace_flags, root.trace_state
        )
