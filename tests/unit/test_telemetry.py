"""Spans are recorded only where they go somewhere; context propagates either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tiermesh.core import server
from tiermesh.core.telemetry import (
    CallerTraces,
    Telemetry,
    extract,
    inject_current,
    trace_id_of,
    unsampled,
)

SAMPLED_PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
UNSAMPLED_PARENT = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"}


def test_without_a_processor_no_new_trace_is_recorded_but_context_flows() -> None:
    t = Telemetry("quiet")
    with t.tracer.start_as_current_span("root") as span:
        assert not span.is_recording()
        assert span.get_span_context().is_valid
        carrier = inject_current()
    flags = int(carrier["traceparent"].rsplit("-", 1)[1], 16)
    assert flags & 0x01 == 0  # propagated, marked unsampled


def test_a_sampled_caller_is_traced_even_without_a_processor() -> None:
    t = Telemetry("quiet")
    with t.tracer.start_as_current_span("child", context=extract(SAMPLED_PARENT)) as span:
        assert span.is_recording()
        assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C


def test_once_a_processor_is_added_spans_are_recorded_and_exported() -> None:
    t = Telemetry("traced")
    exported = InMemorySpanExporter()
    t.provider.add_span_processor(SimpleSpanProcessor(exported))
    with t.tracer.start_as_current_span("root") as span:
        assert span.is_recording()
    with t.tracer.start_as_current_span("child", context=extract(UNSAMPLED_PARENT)) as span:
        assert not span.is_recording()  # the caller's decision still stands
    assert [s.name for s in exported.get_finished_spans()] == ["root"]


def test_a_trace_dir_records_from_the_start(tmp_path: Path) -> None:
    t = Telemetry("filed", tmp_path)
    with t.tracer.start_as_current_span("root") as span:
        assert span.is_recording()
    t.shutdown()
    (written,) = tmp_path.glob("filed-*.jsonl")
    assert '"name": "root"' in written.read_text()


def test_the_configured_sampler_decides_when_exporting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    t = Telemetry("off")
    t.provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    with t.tracer.start_as_current_span("root") as span:
        assert not span.is_recording()
    assert "AlwaysOff" in t.provider.sampler.get_description()


def test_a_hop_records_a_requests_spans_only_where_it_exports() -> None:
    t = Telemetry("hop")
    assert not t.exporting
    assert not t.traces(SAMPLED_PARENT)  # a sampled caller costs nothing here: no export
    t.provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert t.exporting
    assert t.traces(SAMPLED_PARENT) and not t.traces(UNSAMPLED_PARENT) and not t.traces({})


def test_grpc_interceptors_only_where_spans_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OpenTelemetry interceptors cost ~0.2 ms per call even recording nothing: a
    server has one only where spans go, and not at all where its servicer records its own
    (the gateway's public port); an internal channel never (its calls are untraced
    streams)."""
    built: list[Any] = []
    monkeypatch.setattr(server.grpc.aio, "server", lambda **kw: built.append(kw["interceptors"]))
    monkeypatch.setattr(
        server.grpc.aio, "insecure_channel", lambda *a, **kw: built.append(kw.get("interceptors"))
    )
    quiet, traced = Telemetry("quiet"), Telemetry("traced")
    traced.provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    for t in (quiet, traced):
        server.make_server(t)
    server.make_server(traced, intercepted=False)
    server.make_channel("127.0.0.1:1")
    assert built == [[], [built[1][0]], [], None]
    assert len(built[1]) == 1


def test_the_trace_id_of_a_well_formed_traceparent_only() -> None:
    assert trace_id_of(SAMPLED_PARENT) == "0af7651916cd43dd8448eb211c80319c"
    assert trace_id_of({"traceparent": "00-zz"}) is None and trace_id_of({}) is None


def test_a_process_resource_hashes_and_compares_as_the_sdk_resource_it_stands_for() -> None:
    """The resource's hash is kept (the OTLP encoder groups spans by it), not changed."""
    from opentelemetry.sdk.resources import Resource

    t = Telemetry("hashed")
    for resource in (t.provider.resource, t.hop_resource("router")):
        plain = Resource(resource.attributes, resource.schema_url)
        assert resource == plain and hash(resource) == hash(plain)
    assert t.hop_resource("router") is t.hop_resource("router")
    assert t.hop_resource("router").attributes["service.name"] == "tiermesh-router"
    assert t.hop_resource("router") != t.provider.resource


def test_a_callers_sampled_flag_is_followed_only_within_the_rate() -> None:
    now = [0.0]
    limit = CallerTraces(2.0, clock=lambda: now[0])
    assert [limit.admit() for _ in range(3)] == [True, True, False]
    now[0] = 0.5  # one token back at two a second
    assert limit.admit() and not limit.admit()
    assert limit.carrier(dict(SAMPLED_PARENT)) == UNSAMPLED_PARENT  # beyond: unsampled
    assert limit.carrier(dict(UNSAMPLED_PARENT)) == UNSAMPLED_PARENT
    assert unsampled({**SAMPLED_PARENT, "tracestate": "k=v"})["tracestate"] == "k=v"


def test_the_gateways_sampler_follows_callers_within_the_rate() -> None:
    t = Telemetry("gateway")
    exported = InMemorySpanExporter()
    t.provider.add_span_processor(SimpleSpanProcessor(exported))
    t.limit_caller_traces(2.0)
    recorded = []
    for _ in range(5):  # at once: the bucket holds two
        with t.tracer.start_as_current_span("call", context=extract(SAMPLED_PARENT)) as span:
            recorded.append(span.is_recording())
    assert recorded == [True, True, False, False, False]
    with t.tracer.start_as_current_span("root") as span:  # its own roots: not limited
        assert span.is_recording()
    assert len(exported.get_finished_spans()) == 3
