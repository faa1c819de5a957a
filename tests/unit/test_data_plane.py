"""The gateway's data plane over domain values, with a router that answers at once (the one
fake: nothing else of the mesh runs here). Every door calls this path; what is off (audit,
capture, tracing) builds nothing per request."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import json_format
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.conftest import MODELS
from tests.polling import until
from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import CallerTraces, Telemetry
from tiermesh.core.tensors import TensorData
from tiermesh.core.validation import Screen
from tiermesh.gateway import converters
from tiermesh.gateway.adaptive_limit import INTERVAL_NS, MINIMUM
from tiermesh.gateway.books import DoorBooks, DoorRefusals
from tiermesh.gateway.capture import Capture, CaptureState
from tiermesh.gateway.control import ModelControl
from tiermesh.gateway.dispatch import Call
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PendingRequests
from tiermesh.gateway.plane import SERVER, Caller, DataPlane
from tiermesh.gateway.requests import InferRequest
from tiermesh.gateway.rest_codec import config_doc, metadata_doc, server_doc
from tiermesh.gateway.security import AccessGate
from tiermesh.gateway.upstream import Routed, Upstream

RAW = np.arange(16, dtype="<i4").reshape(1, 16).tobytes()
INPUTS = tuple(TensorData(f"INPUT{i}", "INT32", (1, 16), RAW) for i in (0, 1))
OUTPUTS = tuple(TensorData(f"OUTPUT{i}", "INT32", (1, 16), RAW) for i in (0, 1))
CALLER = Caller((), None, "ipv4:127.0.0.1:1")


class AnsweringRouter:
    """Resolves each job's future as it is routed, as a result delivered at once would."""

    def __init__(self, pending: PendingRequests) -> None:
        self._pending = pending
        self.jobs: list[Job] = []

    async def route(self, job: Job, timeout_s: float) -> Routed:
        self.jobs.append(job)
        t = job.timing.received_ns
        timing = Timing(t, t + 1, t + 3, t + 4, t + 5, t + 6, 0, t + 2)
        result = JobResult.for_job(
            job, outputs=OUTPUTS, version="1", tier="edge", worker="w", batch_size=1, timing=timing
        )
        self._pending.resolve(result)
        return Routed("1")


class Liveness:
    async def redis_ok(self) -> bool:
        return True


class RedisAway:
    """Model control's Redis, not reachable: the last state read stays in force."""

    async def get(self, key: str) -> bytes:
        raise RedisConnectionError("redis away")


def _plane(
    caller_traces: CallerTraces | None = None, **settings: Any
) -> tuple[DataPlane, AnsweringRouter, CollectorRegistry]:
    repo = ModelRepository(MODELS)
    repo.load()
    pending = PendingRequests()
    router = AnsweringRouter(pending)
    upstream = Upstream(router, Liveness(), None)  # type: ignore[arg-type]
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    plane = DataPlane(
        GatewaySettings(model_repository=MODELS, **settings),
        repo,
        upstream,
        pending,
        "127.0.0.1:1",
        metrics,
        AccessGate(None, metrics),
        control=ModelControl(RedisAway(), repo, None),  # type: ignore[arg-type]
        control_enabled=False,
        caller_traces=caller_traces,
    )
    return plane, router, registry


def _parse(screen: Screen, model: str = "simple") -> InferRequest:
    for t in INPUTS:
        screen(t.name, t.datatype, t.shape)
    return InferRequest(model, "", INPUTS)


def _count(registry: CollectorRegistry, model: str, code: str) -> float | None:
    labels = {"model": model, "code": code}
    return registry.get_sample_value("tiermesh_requests_total", labels)


async def test_an_answer_is_counted_once_in_metrics_and_statistics() -> None:
    plane, router, registry = _plane()
    answer = await plane.infer("simple", _parse, CALLER)
    assert answer.result.outputs == OUTPUTS and not answer.cache_hit
    assert [job.model for job in router.jobs] == ["simple"]
    assert _count(registry, "simple", "OK") == 1
    assert plane.accepted == plane.answered == 1
    stats = plane.statistics.of("simple", "1")
    assert stats.success.count == 1 and stats.inference_count == 1
    assert stats.execution_count == 1
    labels = {"model": "simple", "tier": "edge", "priority": "2", "bucket": "0", "variant": ""}
    for stage in ("queue", "compute", "total"):
        name = "tiermesh_stage_duration_seconds_count"
        assert registry.get_sample_value(name, {**labels, "stage": stage}) == 1
    assert registry.get_sample_value("tiermesh_request_duration_seconds_count", labels) == 1


async def test_a_tensor_the_model_refuses_is_refused_from_its_shape_before_it_is_read() -> None:
    plane, router, _ = _plane()
    read: list[str] = []

    def parse(screen: Screen) -> InferRequest:
        screen("INPUT0", "INT32", (1, 17))  # the model's INPUT0 is [-1, 16]
        read.append("INPUT0")
        return _parse(screen)

    with pytest.raises(MeshError) as err:
        await plane.infer("simple", parse, CALLER)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "dimension 1 is 17, the model expects 16" in err.value.message
    assert read == [] and router.jobs == []


async def test_a_call_to_an_unknown_model_is_not_read() -> None:
    plane, _, _ = _plane()

    def parse(screen: Screen) -> InferRequest:
        raise AssertionError("the request of an unknown model was read")

    with pytest.raises(MeshError) as err:
        await plane.infer("no-such-model", parse, CALLER)
    assert err.value.code == grpc.StatusCode.NOT_FOUND


async def test_refusals_are_counted_by_code_and_in_the_failed_statistics() -> None:
    plane, router, registry = _plane()
    plane.draining = True
    with pytest.raises(MeshError) as err:
        await plane.infer("simple", _parse, CALLER)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(MeshError) as err:
        await plane.infer("no-such-model", lambda screen: _parse(screen, "no-such-model"), CALLER)
    assert _count(registry, "simple", "UNAVAILABLE") == 1
    assert _count(registry, "unknown", "UNAVAILABLE") == 1
    assert plane.statistics.of("simple", "1").fail.count == 1
    assert router.jobs == []


async def test_what_is_off_builds_nothing_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """No audit entry (auth off), no capture record (not sampling), no span attributes (the
    span is not recorded: no processor, as in production without tracing)."""
    plane, _, _ = _plane()

    def never(*args: Any, **kw: Any) -> Any:
        raise AssertionError("built while off")

    monkeypatch.setattr(AccessGate, "audit", never)
    monkeypatch.setattr(Call, "observed", never)
    plane.capture = Capture(None, CaptureState(rate=0.0), max_len=10)  # type: ignore[arg-type]
    telemetry = Telemetry("gateway")
    with telemetry.tracer.start_as_current_span("ModelInfer") as span:
        assert not span.is_recording()
        monkeypatch.setattr(type(span), "set_attribute", never)
        monkeypatch.setattr(type(span), "set_attributes", never)
        await plane.infer("simple", _parse, CALLER)


async def test_a_sampled_request_is_captured_and_a_traced_one_carries_its_facts() -> None:
    plane, _, _ = _plane()
    plane.capture = capture = Capture(None, CaptureState(rate=1.0), max_len=10)  # type: ignore[arg-type]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("test").start_as_current_span("ModelInfer"):
        answer = await plane.infer("simple", _parse, CALLER)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None
    assert span.attributes["tiermesh.request_id"] == answer.result.request_id
    assert span.attributes["tiermesh.tier"] == "edge"
    assert span.attributes["tiermesh.compute_ms"] == pytest.approx(1e-6)
    (observed,) = capture._queue
    assert observed.code == "OK" and observed.result == answer.result


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
PARENT = ("traceparent", TRACEPARENT)
STATE = ("tracestate", "vendor=value")


@pytest.mark.parametrize(
    ("headers", "carried"),
    [
        ((PARENT, STATE), (PARENT, STATE)),
        ((("traceparent", TRACEPARENT.upper()),), ()),  # not W3C: lower-case hex only
        ((("traceparent", "00-zz"), STATE), ()),
        ((PARENT, ("tracestate", "k=" + "v" * 600)), (PARENT,)),  # over W3C's 512
        ((), ()),
    ],
)
async def test_a_gateway_that_records_no_span_passes_the_callers_context_on(
    headers: tuple[tuple[str, str], ...], carried: tuple[tuple[str, str], ...]
) -> None:
    """No interceptor, no span (tracing off): the job still continues the caller's trace,
    for a downstream service that exports; a malformed or oversized header is dropped."""
    plane, router, _ = _plane()
    await plane.infer("simple", _parse, Caller((("x-other", "1"), *headers), None, ""))
    (job,) = router.jobs
    assert job.trace_context == dict(carried)


async def test_a_callers_sampled_flag_travels_on_only_within_the_rate() -> None:
    plane, router, _ = _plane(caller_traces=CallerTraces(1.0, clock=lambda: 0.0))
    for _ in range(2):
        await plane.infer("simple", _parse, Caller((PARENT,), None, ""))
    first, second = (job.trace_context["traceparent"] for job in router.jobs)
    assert first == TRACEPARENT
    assert second == TRACEPARENT[:-2] + "00"  # the same trace, unsampled


async def test_in_flight_beyond_the_limit_is_refused() -> None:
    plane, _, registry = _plane(max_in_flight=1)
    plane._pending.register("someone-else")
    with pytest.raises(MeshError) as err:
        await plane.infer("simple", _parse, CALLER)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _count(registry, "simple", "RESOURCE_EXHAUSTED") == 1


async def test_metadata_operations_answer_in_domain_values() -> None:
    plane, _, _ = _plane()
    assert await plane.server_ready()
    assert plane.server_metadata() == SERVER
    assert plane.model(CALLER, "simple", "").name == "simple"
    with pytest.raises(MeshError) as err:
        plane.model(CALLER, "simple", "9")
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    (doc,) = await plane.statistics_docs(CALLER, "simple", "1")
    assert doc["name"] == "simple" and doc["inference_count"] == 0
    plane.draining = True
    assert not await plane.server_ready()
    assert not await plane.model_ready(CALLER, "simple", "")


def _proto_doc(message: Any, key: str) -> dict[str, Any]:
    """What the REST door answered when it rendered the gRPC responses as JSON."""
    doc: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    for name in ("inputs", "outputs") if key == "shape" else ("input", "output"):
        doc[name] = [{**t, key: [int(d) for d in t.get(key, [])]} for t in doc.get(name, [])]
    return doc


@pytest.mark.parametrize("model", sorted(ModelRepository(MODELS).load()))
def test_rest_documents_are_the_json_mapping_of_the_grpc_responses(model: str) -> None:
    cfg = ModelRepository(MODELS).load()[model]
    assert metadata_doc(cfg) == _proto_doc(converters.model_metadata(cfg), "shape")
    assert config_doc(cfg) == _proto_doc(converters.model_config(cfg).config, "dims")


def test_server_metadata_lists_the_extensions_on_both_doors() -> None:
    message = converters.server_metadata(SERVER)
    assert server_doc(SERVER) == json_format.MessageToDict(message)
    assert "statistics" in message.extensions


@pytest.mark.parametrize("module", ["plane", "dispatch", "facts"])
def test_the_data_plane_holds_no_proto_types(module: str) -> None:
    source = (Path(__file__).parents[2] / f"services/tiermesh/gateway/{module}.py").read_text()
    for proto in ("_pb2", "tritonclient", "grpc.aio", "ServicerContext"):
        assert proto not in source, f"{module}.py mentions {proto}"


class WaitingRouter:
    """Answers each job as AnsweringRouter does, its batch started `wait_ns` after it was
    received; with `hold`, keeps the jobs' results until `release_all`."""

    def __init__(self, pending: PendingRequests, wait_ns: int) -> None:
        self._pending = pending
        self.wait_ns = wait_ns
        self.hold = False
        self.held: list[JobResult] = []

    async def route(self, job: Job, timeout_s: float) -> Routed:
        t = job.timing.received_ns
        start = t + self.wait_ns
        timing = Timing(t, t + 1, t + 3, start, start + 1, start + 2, 0, t + 2)
        result = JobResult.for_job(job, outputs=OUTPUTS, version="1", worker="w", timing=timing)
        if self.hold:
            self.held.append(result)
        else:
            self._pending.resolve(result)
        return Routed("1")

    def release_all(self) -> None:
        for result in self.held:
            self._pending.resolve(result)
        self.held.clear()


async def test_a_class_that_waits_long_is_limited_and_refused_with_a_retry_after() -> None:
    plane, _, _ = _plane(max_in_flight=2 * MINIMUM)  # the class starts at 8
    now = [10**18]
    plane._clock_ns = plane._dispatch._clock_ns = lambda: now[0]
    router = WaitingRouter(plane._pending, wait_ns=1_000_000_000)  # a standing queue of 1 s
    plane._dispatch._up = Upstream(router, Liveness(), None)  # type: ignore[arg-type]
    router.hold = True
    # An interval at its limit, every answer after a 1 s wait: the limit halves, to 4.
    held = [asyncio.create_task(plane.infer("simple", _parse, CALLER)) for _ in range(8)]
    await until(_count_of(router, 8), "the held jobs routed")
    router.release_all()
    await asyncio.gather(*held)
    now[0] += INTERVAL_NS
    held = [asyncio.create_task(plane.infer("simple", _parse, CALLER)) for _ in range(MINIMUM)]
    await until(_count_of(router, MINIMUM), "the held jobs routed")
    with pytest.raises(MeshError) as err:
        await plane.infer("simple", _parse, CALLER)
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.retry_after_ms is not None and err.value.retry_after_ms > 0
    assert f"({MINIMUM})" in err.value.message
    # Another priority of the same model is its own class, at its own limit.
    urgent = asyncio.create_task(plane.infer("simple", _parse_urgent, CALLER))
    await until(_count_of(router, MINIMUM + 1), "the held jobs routed")
    router.release_all()
    await asyncio.gather(*held, urgent)


async def test_the_adaptive_limit_can_be_turned_off() -> None:
    plane, _, _ = _plane(max_in_flight=2 * MINIMUM, adaptive_limit=False)
    now = [10**18]
    plane._clock_ns = plane._dispatch._clock_ns = lambda: now[0]
    router = WaitingRouter(plane._pending, wait_ns=1_000_000_000)
    plane._dispatch._up = Upstream(router, Liveness(), None)  # type: ignore[arg-type]
    router.hold = True
    for _ in range(2):  # what halved the adaptive limit above changes nothing here
        held = [asyncio.create_task(plane.infer("simple", _parse, CALLER)) for _ in range(8)]
        await until(_count_of(router, 8), "the held jobs routed")
        router.release_all()
        await asyncio.gather(*held)
        now[0] += INTERVAL_NS


def _parse_urgent(screen: Screen) -> InferRequest:
    request = _parse(screen)
    return dataclasses.replace(request, priority=1)


def _count_of(router: WaitingRouter, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return len(router.held) == n

    return check


async def test_the_doors_refusals_counted_together_are_booked_as_failed_calls() -> None:
    plane, _, _ = _plane()
    books = DoorBooks(plane._repo, plane.dispatcher, None, None)  # type: ignore[arg-type]
    refused = [
        DoorRefusals("simple", "", 3, 6_000),
        DoorRefusals("simple", "1", 2, 1_000),  # the default version, named
        DoorRefusals("no-such-model", "", 5, 1),
    ]
    assert await books.record([], [], [], refused) == 10
    stats = plane.statistics.of("simple", "1")
    assert (stats.fail.count, stats.fail.ns) == (5, 7_000)
    assert stats.success.count == 0
