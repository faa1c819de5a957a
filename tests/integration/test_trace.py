"""One request's trace spans gateway, router, queue, worker and postprocess (in-process),
with the worker delivering a batch that has no output step itself (the default) or every
batch going through postprocess."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import InProcessMesh, start_mesh

pytestmark = pytest.mark.integration
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(params=[True, False], ids=["direct", "through-postprocess"])
async def either_mesh(
    request: pytest.FixtureRequest, redis_url: str, model_repo: Path
) -> AsyncIterator[tuple[InProcessMesh, str]]:
    """The mesh with the worker's direct delivery on (the default) and off, and whose span
    its postprocess stage is: mlp has no output step, so with direct delivery its worker
    handed the result on and postprocess never saw it."""
    m = await start_mesh(redis_url, model_repo, direct_delivery=request.param)
    try:
        yield m, "tiermesh-worker" if request.param else "tiermesh-postprocess"
    finally:
        await m.close()


async def test_one_trace_spans_every_service(
    either_mesh: tuple[InProcessMesh, str],
) -> None:
    mesh, postprocessed_by = either_mesh
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        x = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        await client.infer("mlp", [x], request_id="trace-me")
    finally:
        await client.close()

    spans = mesh.exporter.get_finished_spans()
    root = next(
        s
        for s in spans
        if s.attributes and s.attributes.get("tiermesh.client_request_id") == "trace-me"
    )
    trace_id = root.context.trace_id
    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    services = {s.resource.attributes["service.name"] for s in in_trace}
    assert services == {
        "tiermesh-gateway",
        "tiermesh-router",
        "tiermesh-worker",
        postprocessed_by,
    }
    kinds = {s.kind for s in in_trace}
    assert SpanKind.PRODUCER in kinds
    names = {s.name for s in in_trace}
    assert {"queue wait", "compute", "postprocess", "deliver"} <= names
    # The batch's CONSUMER span lives in its own trace and links to this request.
    consumers = [s for s in spans if s.kind == SpanKind.CONSUMER]
    batch = next(c for c in consumers if any(ln.context.trace_id == trace_id for ln in c.links))
    # ...and the request's compute span links back to that batch.
    compute = next(s for s in in_trace if s.name == "compute")
    assert [ln.context.span_id for ln in compute.links] == [batch.context.span_id]


async def test_trace_structure_and_batch_links(
    either_mesh: tuple[InProcessMesh, str],
) -> None:
    """Each request: gateway server span is the root; the router's `route` span (the
    PRODUCER of its stream entry) is the root's child; the worker's queue-wait and compute
    spans and the postprocess and deliver spans are children of the route span, each under
    its service's name, written by the gateway from the request's timing and covering the
    instants the response reports. The batch's CONSUMER span links to every request
    computed in it. The stream of batches itself is in no trace."""
    mesh, postprocessed_by = either_mesh
    mesh.exporter.clear()
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        calls = []
        for i in range(6):
            x = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            x.set_data_from_numpy(np.full((1, 4), i, dtype=np.float32))
            calls.append(client.infer("mlp", [x], request_id=f"s{i}"))
        await asyncio.gather(*calls)
    finally:
        await client.close()
    spans = mesh.exporter.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}

    def parent(s: Any) -> Any:
        return by_id.get(s.parent.span_id) if s.parent else None

    roots = [
        s
        for s in spans
        if s.name == MODEL_INFER
        and str(s.attributes.get("tiermesh.client_request_id", "")).startswith("s")
    ]
    assert len(roots) == 6
    consumers = [s for s in spans if s.kind == SpanKind.CONSUMER]
    for root in roots:
        assert root.parent is None
        trace_spans = [s for s in spans if s.context.trace_id == root.context.trace_id]
        named = {s.name: s for s in trace_spans}
        route = named["route"]
        assert route.kind == SpanKind.PRODUCER and parent(route) is root
        assert route.resource.attributes["service.name"] == "tiermesh-router"
        assert str(route.attributes["messaging.destination.name"]).startswith("tm:")
        services = {
            "route": "tiermesh-router",
            "queue wait": "tiermesh-worker",
            "compute": "tiermesh-worker",
            "postprocess": postprocessed_by,
            "deliver": "tiermesh-gateway",
        }
        for name, service in services.items():
            span = named[name]
            assert span.resource.attributes["service.name"] == service, name
            assert span.start_time is not None and span.end_time is not None
            assert root.start_time <= span.start_time <= span.end_time <= root.end_time, name
            if name != "route":
                assert parent(span) is route, name
            if service != "tiermesh-gateway":
                assert span.resource.attributes["tiermesh.reported_by"] == "gateway", name
        # The spans cover what the response reports: compute is the batch's run.
        compute_ms = (named["compute"].end_time - named["compute"].start_time) / 1e6
        assert compute_ms == pytest.approx(root.attributes["tiermesh.compute_ms"], abs=1e-3)
        assert named["compute"].attributes["tiermesh.worker"] == root.attributes["tiermesh.worker"]
        # Its batch links to it, and its compute span links back to that batch.
        batch = next(
            c
            for c in consumers
            if any(ln.context.span_id == route.context.span_id for ln in c.links)
        )
        assert [ln.context.span_id for ln in named["compute"].links] == [batch.context.span_id]
        assert batch.attributes["messaging.batch.message_count"] == len(batch.links)
    assert not [s for s in spans if "RouteStream" in s.name]


async def test_a_refused_call_is_a_span_with_its_status(mesh: InProcessMesh) -> None:
    """The gateway's own span of a public call (no interceptor on the public port) says
    how the call ended, and a request that never reached the router has no hop spans."""
    mesh.exporter.clear()
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        x = aioclient.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        with pytest.raises(InferenceServerException) as info:
            await client.infer("no-such-model", [x], request_id="refused")
    finally:
        await client.close()
    assert "no-such-model" in str(info.value)
    spans = mesh.exporter.get_finished_spans()
    root = next(s for s in spans if s.name == MODEL_INFER)
    assert root.kind == SpanKind.SERVER
    assert root.attributes["rpc.system"] == "grpc"
    assert root.attributes["rpc.method"] == "ModelInfer"
    assert root.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert root.status.status_code == StatusCode.ERROR
    assert [s for s in spans if s.context.trace_id == root.context.trace_id] == [root]
