"""OpenTelemetry set-up and W3C context carried through stream entries and results.

OTLP export follows the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_TRACES_EXPORTER=otlp). With TIERMESH_TRACE_DIR set, every process also writes its
finished spans as JSON lines to ``<trace_dir>/<service>-<pid>.jsonl``.

Spans are recorded only where they go somewhere: while a process has no span processor
(no exporter, no trace dir) it starts no trace of its own (``ParentBased(ALWAYS_OFF)``),
so a request that arrives without a sampled ``traceparent`` costs no span anywhere on
the mesh; context still propagates. A caller that sends a sampled ``traceparent`` is
traced as before. Once a processor is added, the sampler of OTEL_TRACES_SAMPLER (default
``parentbased_always_on``) decides.

A process may also write finished spans for another service (`finished`, `emit`, under
`hop_resource`): the gateway writes a traced request's hop spans from the instants the hops
recorded, so the hops themselves write no span per request (gateway/hop_spans.py).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider, sampling
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceState
from opentelemetry.util.types import Attributes


class Telemetry:
    """Owns the tracer provider of one process; `shutdown` flushes and closes exporters."""

    def __init__(self, service: str, trace_dir: Path | None = None) -> None:
        self.service = service
        self.provider = _Provider(
            resource=_resource(
                {"service.name": os.environ.get("OTEL_SERVICE_NAME", f"tiermesh-{service}")}
            )
        )
        self._file: IO[str] | None = None
        if trace_dir is not None:
            trace_dir.mkdir(parents=True, exist_ok=True)
            self._file = (trace_dir / f"{service}-{os.getpid()}.jsonl").open("a", buffering=1)
            self.provider.add_span_processor(
                SimpleSpanProcessor(ConsoleSpanExporter(out=self._file, formatter=_one_line))
            )
        if _otlp_wanted():
            from tiermesh.core.otlp_wire import SpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(SpanExporter()))
        self.tracer = self.provider.get_tracer(f"tiermesh.{service}")
        self._scope = InstrumentationScope(f"tiermesh.{service}")
        self._hop_resources: dict[str, Resource] = {}

    def limit_caller_traces(self, per_s: float) -> CallerTraces:
        """Follow callers' sampled contexts only `per_s` calls a second (the gateway)."""
        limit = CallerTraces(per_s)
        self.provider.limit_caller_traces(limit)
        return limit

    @property
    def exporting(self) -> bool:
        """Whether spans go anywhere (a span file, an OTLP exporter, a test's processor).
        When not, nothing here records or intercepts: tracing off costs nothing."""
        return self.provider.exporting

    def traces(self, carrier: Mapping[str, str]) -> bool:
        """Whether this process records spans on the trace `carrier` continues: it exports,
        and the trace is sampled. A hop that handles many requests at once starts a
        request's spans only where this holds."""
        return self.provider.exporting and is_sampled(carrier)

    def new_span_id(self) -> int:
        return int(self.provider.id_generator.generate_span_id())

    def hop_resource(self, service: str) -> Resource:
        """The resource of spans this process writes for another service of the mesh, from
        the instants that service recorded (the gateway writes a request's hop spans): that
        service's name, and who wrote them."""
        resource = self._hop_resources.get(service)
        if resource is None:
            resource = _resource(
                {"service.name": f"tiermesh-{service}", "tiermesh.reported_by": self.service}
            )
            self._hop_resources[service] = resource
        return resource

    def finished(
        self,
        name: str,
        context: trace.SpanContext,
        parent: trace.SpanContext | None,
        resource: Resource,
        start_ns: int,
        end_ns: int,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] = (),
        status: Status | None = None,
    ) -> ReadableSpan:
        """A span that ended already, with the instants it covered."""
        return ReadableSpan(
            name,
            context,
            parent,
            resource,
            attributes if attributes is not None else {},  # as a started span's: a mapping
            (),
            links,
            kind,
            status=status or Status(StatusCode.UNSET),
            instrumentation_scope=self._scope,
            start_time=start_ns,
            end_time=max(end_ns, start_ns),
        )

    def emit(self, spans: Iterable[ReadableSpan]) -> None:
        """Hand finished spans to this process's span processors, as a span's end does."""
        for processor in self.provider.processors:
            for span in spans:
                processor.on_end(span)

    def shutdown(self) -> None:
        """Called last at service stop: flush pending spans, close the span file."""
        self.provider.shutdown()
        if self._file is not None:
            self._file.close()


class CallerTraces:
    """How many calls a second a caller's sampled traceparent may have recorded: a caller
    who marks every request sampled would otherwise make this process record and export
    spans for all of them. A token bucket of `per_s` tokens a second (as many at once); a
    call beyond it continues its caller's trace unsampled. Owned by the gateway's Telemetry
    (its public calls are the ones a caller's flags reach)."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._per_s = per_s
        self._burst = max(1.0, per_s)
        self._tokens = self._burst
        self._clock = clock
        self._at = clock()

    def admit(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def carrier(self, carrier: dict[str, str]) -> dict[str, str]:
        """A caller's W3C context as it may travel on: sampled only within the rate."""
        if not is_sampled(carrier) or self.admit():
            return carrier
        return unsampled(carrier)


def unsampled(carrier: Mapping[str, str]) -> dict[str, str]:
    """The same W3C context with the sampled flag cleared (the trace goes on, unrecorded)."""
    parent = carrier["traceparent"]
    flags = int(parent[-2:], 16) & ~int(trace.TraceFlags.SAMPLED)
    return {**carrier, "traceparent": f"{parent[:-2]}{flags:02x}"}


def _remote_sampled(parent_context: Context | None) -> bool:
    parent = trace.get_current_span(parent_context).get_span_context()
    return parent.is_valid and parent.is_remote and parent.trace_flags.sampled


class _WhenExported(sampling.Sampler):
    """The configured sampler while the provider exports somewhere, else no new traces; a
    caller's sampled context is followed only within `caller_traces`' rate, where set."""

    def __init__(self, exported: sampling.Sampler) -> None:
        self.exporting = False
        self._exported = exported
        self._quiet = sampling.ParentBased(sampling.ALWAYS_OFF)
        self.caller_traces: CallerTraces | None = None

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> sampling.SamplingResult:
        limit = self.caller_traces
        if limit is not None and _remote_sampled(parent_context) and not limit.admit():
            return sampling.SamplingResult(sampling.Decision.DROP, trace_state=trace_state)
        sampler = self._exported if self.exporting else self._quiet
        return sampler.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"WhenExported{{{self._exported.get_description()}}}"


class _Provider(TracerProvider):
    """A tracer provider that records spans only once a span processor is added."""

    def __init__(self, resource: Resource) -> None:
        # The sampler OTEL_TRACES_SAMPLER names, as the SDK reads it for a plain provider.
        configured = TracerProvider(shutdown_on_exit=False).sampler
        self._gate = _WhenExported(configured)
        super().__init__(resource=resource, sampler=self._gate)
        self.processors: list[SpanProcessor] = []

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        super().add_span_processor(span_processor)
        self.processors.append(span_processor)
        self._gate.exporting = True

    @property
    def exporting(self) -> bool:
        return self._gate.exporting

    def limit_caller_traces(self, limit: CallerTraces) -> None:
        self._gate.caller_traces = limit


class _HashedResource(Resource):
    """A resource that computes its hash once. The OTLP encoder groups every exported span
    by its resource, and a Resource hashes by writing its attributes as JSON each time: ~8 us
    per span, a third of a span's export."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def _resource(attributes: Attributes) -> Resource:
    """`Resource.create` (the SDK's defaults and OTEL_RESOURCE_ATTRIBUTES merged in)."""
    return _HashedResource(Resource.create(attributes))


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def _otlp_wanted(env: Mapping[str, str] = os.environ) -> bool:
    exporter = env.get("OTEL_TRACES_EXPORTER", "")
    if exporter:
        return "otlp" in exporter.split(",")
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def spans_written(env: Mapping[str, str]) -> bool:
    """Whether the services started with `env` write spans (OTLP export or a trace dir)."""
    return _otlp_wanted(env) or bool(env.get("TIERMESH_TRACE_DIR"))


def uses_default_sampler(env: Mapping[str, str]) -> bool:
    """Whether OTEL_TRACES_SAMPLER in `env` is the SDK's default (parent-based, always on at
    the root): the one sampler the Go front door applies itself (its Go mirror:
    `defaultSampler`); with another, every traced call goes to the Python gateway."""
    return env.get("OTEL_TRACES_SAMPLER", "") in ("", "parentbased_always_on")


def inject_current() -> dict[str, str]:
    """The current context as W3C headers (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def is_sampled(carrier: Mapping[str, str]) -> bool:
    """Whether a W3C traceparent says its trace is recorded (the sampled flag)."""
    parts = carrier.get("traceparent", "").split("-")
    if len(parts) < 4 or len(parts[3]) != 2:
        return False
    try:
        return bool(int(parts[3], 16) & 1)
    except ValueError:
        return False


TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
TRACESTATE_MAX = 512  # W3C: a vendor may drop a longer tracestate


def trace_id_of(carrier: Mapping[str, str]) -> str | None:
    """The trace id (32 hex digits) a well-formed W3C traceparent names, else None."""
    parent = carrier.get("traceparent", "")
    return parent.split("-")[1] if TRACEPARENT.fullmatch(parent) else None


def w3c_context(metadata: Iterable[tuple[str, str | bytes]]) -> dict[str, str]:
    """A caller's W3C trace context from its request headers: what a gateway that records no
    span of its own passes on, so the request stays on its caller's trace downstream. Only
    a well-formed traceparent (and a tracestate with it, within the W3C bound) is kept: the
    headers are the caller's, and they travel in every queue entry."""
    parent = state = None
    for key, value in metadata:
        if key == "traceparent" and isinstance(value, str):
            parent = value
        elif key == "tracestate" and isinstance(value, str):
            state = value
    if parent is None or not TRACEPARENT.fullmatch(parent):
        return {}
    if state is None or len(state) > TRACESTATE_MAX:
        return {"traceparent": parent}
    return {"traceparent": parent, "tracestate": state}


def traceparent_of(context: trace.SpanContext) -> str:
    """The W3C traceparent that continues from `context`."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def parse_traceparent(value: str) -> trace.SpanContext | None:
    """The (remote) span context a well-formed W3C traceparent names, else None: what
    `extract` finds, without building a context per call."""
    if not TRACEPARENT.fullmatch(value):
        return None
    _, trace_id, span_id, flags = value.split("-")
    context = trace.SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16)),
    )
    return context if context.is_valid else None


def inject_into(span: trace.Span) -> dict[str, str]:
    """W3C headers that continue from `span` (not the current one)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    return propagate.extract(dict(carrier))


def span_context_of(carrier: Mapping[str, str]) -> trace.SpanContext:
    return trace.get_current_span(extract(carrier)).get_span_context()
