"""OpenTelemetry set-up and W3C context carried through stream entries and results.

OTLP export follows the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_TRACES_EXPORTER=otlp). With TIERMESH_TRACE_DIR set, every process also writes its
finished spans as JSON lines to ``<trace_dir>/<service>-<pid>.jsonl``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)


class Telemetry:
    """Owns the tracer provider of one process; `shutdown` flushes and closes exporters."""

    def __init__(self, service: str, trace_dir: Path | None = None) -> None:
        self.service = service
        self.provider = TracerProvider(
            resource=Resource.create(
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
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        self.tracer = self.provider.get_tracer(f"tiermesh.{service}")

    def shutdown(self) -> None:
        """Called last at service stop: flush pending spans, close the span file."""
        self.provider.shutdown()
        if self._file is not None:
            self._file.close()


def _one_line(span: ReadableSpan) -> str:
    return str(span.to_json(indent=None)) + "\n"


def _otlp_wanted() -> bool:
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "")
    if exporter:
        return "otlp" in exporter.split(",")
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def inject_current() -> dict[str, str]:
    """The current context as W3C headers (traceparent, tracestate)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, str]) -> otel_context.Context:
    return propagate.extract(dict(carrier))


def span_context_of(carrier: Mapping[str, str]) -> trace.SpanContext:
    return trace.get_current_span(extract(carrier)).get_span_context()
