"""A traced request's hop spans, written by its gateway from the request's timing."""

from __future__ import annotations

import json

import grpc
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState

from tiermesh.core.jobs import JobResult, Timing
from tiermesh.core.telemetry import Telemetry, parse_traceparent, traceparent_of
from tiermesh.gateway.hop_spans import HopSpans

ROOT = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, False, TraceFlags(1))
BATCH = "00-11111111111111111111111111111111-2222222222222222-01"
TIMING = Timing(
    received_ns=1_000,
    routed_ns=2_000,
    enqueued_ns=3_000,
    dequeued_ns=5_000,
    batch_start_ns=6_000,
    batch_end_ns=9_000,
    postprocessed_ns=10_000,
    delivered_ns=12_000,
)


def _spans() -> tuple[HopSpans, InMemorySpanExporter]:
    telemetry = Telemetry("gateway")
    exported = InMemorySpanExporter()
    telemetry.provider.add_span_processor(SimpleSpanProcessor(exported))
    return HopSpans(telemetry), exported


def test_every_hop_gets_its_span_under_its_service_from_the_timing() -> None:
    spans, exported = _spans()
    hops = spans.choose(ROOT)
    carrier = hops.carrier()
    downstream = parse_traceparent(carrier["traceparent"])
    assert downstream is not None and downstream.trace_id == ROOT.trace_id
    assert downstream.span_id == hops.route.span_id != ROOT.span_id
    assert "tracestate" not in carrier
    with_state = spans.choose(SpanContext(1, 2, True, TraceFlags(1), TraceState([("k", "v")])))
    assert with_state.carrier()["tracestate"] == "k=v"
    result = JobResult(
        "r1", "mlp", "gw", timing=TIMING, batch_size=3, worker="w1", batch_traceparent=BATCH
    )
    hops.placed("tm:{mlp@1.fp32}:q:center:p0:b0", "1-0", 1_500, 4_000).write(result)

    by_name = {s.name: s for s in exported.get_finished_spans()}
    assert set(by_name) == {"route", "queue wait", "compute", "postprocess", "deliver"}
    route = by_name["route"]
    assert route.kind == SpanKind.PRODUCER
    assert route.context.span_id == hops.route.span_id and route.parent == ROOT
    # The router's own instants, not the gateway's view of the call.
    assert (route.start_time, route.end_time) == (2_000, 3_000)
    assert route.attributes["messaging.destination.name"] == "tm:{mlp@1.fp32}:q:center:p0:b0"
    expected = {
        "queue wait": ("tiermesh-worker", 3_000, 5_000),
        "compute": ("tiermesh-worker", 6_000, 9_000),
        "postprocess": ("tiermesh-postprocess", 9_000, 10_000),
        "deliver": ("tiermesh-gateway", 10_000, 12_000),
    }
    for name, (service, start, end) in expected.items():
        span = by_name[name]
        assert span.resource.attributes["service.name"] == service, name
        assert (span.start_time, span.end_time) == (start, end), name
        assert span.parent is not None and span.parent.span_id == hops.route.span_id, name
        assert span.context.trace_id == ROOT.trace_id
    assert route.resource.attributes["tiermesh.reported_by"] == "gateway"
    compute = by_name["compute"]
    assert compute.attributes["tiermesh.worker"] == "w1"
    assert compute.attributes["tiermesh.batch_rows"] == 3
    assert [traceparent_of(link.context) for link in compute.links] == [BATCH]
    ids = {s.context.span_id for s in exported.get_finished_spans()}
    assert len(ids) == 5
    # Written out as any span is (a trace dir's JSON lines): attributes are a mapping.
    for span in exported.get_finished_spans():
        assert isinstance(json.loads(span.to_json())["attributes"], dict), span.name


def test_without_an_answer_only_the_route_span_as_the_gateway_saw_it() -> None:
    spans, exported = _spans()
    hops = spans.choose(ROOT)
    hops.placed("tm:s", "1-0", 1_500, 4_000).write(None)
    (route,) = exported.get_finished_spans()
    assert route.name == "route" and (route.start_time, route.end_time) == (1_500, 4_000)


def test_a_stage_the_request_skipped_has_no_span() -> None:
    """A poison request's ABORTED result never ran in a batch: no compute span, and no
    link to a batch."""
    spans, exported = _spans()
    hops = spans.choose(ROOT)
    timing = Timing(received_ns=1, routed_ns=2, enqueued_ns=3, dequeued_ns=4, delivered_ns=9)
    failed = JobResult("r1", "mlp", "gw", code=grpc.StatusCode.ABORTED, timing=timing)
    hops.placed("tm:s", "1-0", 1, 5).write(failed)
    assert {s.name for s in exported.get_finished_spans()} == {"route", "queue wait"}


def test_traceparents_round_trip_and_bad_ones_are_refused() -> None:
    assert parse_traceparent(traceparent_of(ROOT)) == SpanContext(
        ROOT.trace_id, ROOT.span_id, True, ROOT.trace_flags
    )
    zero_trace = "00-" + "0" * 32 + "-" + "1" * 16 + "-01"
    upper = "00-" + "A" * 32 + "-" + "1" * 16 + "-01"
    for bad in ("", "00-xyz", zero_trace, upper):
        assert parse_traceparent(bad) is None, bad
