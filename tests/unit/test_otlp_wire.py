"""The spans' OTLP request written as bytes (core/otlp_wire.py) is the SDK encoder's, byte for
byte, over every field and value type that encoder writes; and the exporter sends it."""

from __future__ import annotations

import logging
from concurrent import futures

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from tiermesh.core import otlp_wire
from tiermesh.core.otlp_wire import SpanExporter, encode_request

ROUTER = Resource.create({"service.name": "tiermesh-router", "tiermesh.reported_by": "gw"})
WORKER = Resource({"service.name": "w", "n": 3}, schema_url="https://opentelemetry.io/schemas/1.2")
SCOPE = InstrumentationScope("tiermesh.gateway")
VERSIONED = InstrumentationScope("x", "1.0", "https://example.test/schema", {"k": "v"})
TRACE = 0x0AF7651916CD43DD8448EB211C80319C
STATE = TraceState([("vendor", "abc"), ("other", "x=1")])


def ctx(span_id: int, remote: bool = False, state: TraceState | None = None) -> SpanContext:
    return SpanContext(TRACE, span_id, remote, TraceFlags(1), state)


def span(**kw: object) -> ReadableSpan:
    args: dict[str, object] = dict(
        name="route",
        context=ctx(0xB7AD6B7169203331),
        parent=ctx(0x00F067AA0BA902B7),
        resource=ROUTER,
        attributes={},
        kind=SpanKind.PRODUCER,
        status=Status(StatusCode.UNSET),
        instrumentation_scope=SCOPE,
        start_time=1_700_000_000_123_456_789,
        end_time=1_700_000_000_223_456_789,
    )
    args.update(kw)
    return ReadableSpan(**args)  # type: ignore[arg-type]


VALUES: dict[str, object] = {
    "str": "redis",
    "empty": "",
    "unicode": "déjà vu ✓",
    "true": True,
    "false": False,
    "zero": 0,
    "int": 300,
    "big": 2**62,
    "negative": -5,
    "float": 0.25,
    "float0": 0.0,
    "bytes": b"\x00\xff",
    "strs": ("a", "b"),
    "ints": [1, -2, 3],
    "mixed": (True, 1.5, "x"),
    "none": None,
    "map": {"a": 1, "b": ("c",)},
}

CASES = {
    "plain": [span()],
    "every value type": [span(attributes=VALUES)],
    "root span, no parent": [span(parent=None, kind=SpanKind.SERVER)],
    "remote parent and tracestate": [span(context=ctx(5, state=STATE), parent=ctx(6, remote=True))],
    "events and links": [
        span(
            events=(Event("e1", {"a": 1}, 123), Event("", None, 0)),
            links=(Link(ctx(7, remote=True), {"l": "x"}), Link(ctx(8))),
        )
    ],
    "status": [
        span(status=Status(StatusCode.ERROR, "UNAVAILABLE: no worker")),
        span(status=Status(StatusCode.OK)),
    ],
    "zero times and no name": [span(name="", start_time=0, end_time=0, kind=SpanKind.INTERNAL)],
    "resources and scopes grouped in order": [
        span(),
        span(resource=WORKER, name="compute"),
        span(instrumentation_scope=VERSIONED, name="deliver"),
        span(resource=WORKER, instrumentation_scope=None, name="queue wait"),
        span(name="again"),
    ],
    "equal resources that are different objects": [
        span(resource=Resource({"service.name": "w", "n": 3}, WORKER.schema_url)),
        span(name="between"),
        span(resource=WORKER, name="same group as the first"),
    ],
    "nothing": [],
}


@pytest.mark.parametrize("spans", CASES.values(), ids=CASES.keys())
def test_bytes_are_the_sdk_encoders(spans: list[ReadableSpan]) -> None:
    expected = encode_spans(spans).SerializeToString(deterministic=True)
    assert encode_request(spans) == expected


def test_an_attribute_of_no_otlp_type_is_logged_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bad = span(attributes={"ok": "x", "bad": object()})  # bypasses the SDK's own cleaning
    with caplog.at_level(logging.ERROR):
        data = encode_request([bad])
    assert data == encode_request([span(attributes={"ok": "x"})])
    assert "bad" in caplog.text


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_the_exporter_sends_the_request_written_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sent as written by encode_request: the exporter's hook for its request is the
    library's `_translate_data`; were it renamed, the SDK's encoder would write it again
    (the same bytes, slower), which the count of calls shows."""
    written: list[int] = []

    def counted(spans: list[ReadableSpan]) -> bytes:
        written.append(len(spans))
        return encode_request(spans)

    monkeypatch.setattr(otlp_wire, "encode_request", counted)
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    spans = CASES["resources and scopes grouped in order"] + CASES["every value type"]
    exporter = SpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
        server.stop(None)
    (request,) = collector.requests
    assert written == [len(spans)]
    assert request.SerializeToString(deterministic=True) == encode_request(spans)
    names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(names) == sorted(s.name for s in spans)
