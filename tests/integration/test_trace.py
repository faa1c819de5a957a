"""One request's trace spans gateway, router, queue, worker and postprocess (in-process)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from opentelemetry.trace import SpanKind

from tests.integration.conftest import InProcessMesh

pytestmark = pytest.mark.integration


async def test_one_trace_spans_every_service(mesh: InProcessMesh) -> None:
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
        "tiermesh-postprocess",
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
