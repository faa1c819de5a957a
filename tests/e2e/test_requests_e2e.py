"""The whole mesh as separate processes, called through tritonclient unmodified."""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.conftest import UpProcess, door_places, door_serves, scrape_metrics
from tests.polling import eventually
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_client import connect_sync

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def reference(up: UpProcess, x: np.ndarray) -> np.ndarray:
    """The same model run by onnxruntime directly, the mesh's expected answer."""
    path = up.trace_dir.parent / "models" / "mlp" / "1" / "model.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(["OUTPUT0"], {"INPUT0": x})[0])


def mlp_input(x: np.ndarray) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


@contextmanager
def service_stopped(up: UpProcess, service: str) -> Iterator[None]:
    """SIGSTOP one child of `up` (by `children()`'s name) for the block, then SIGCONT."""
    pid = up.children()[service]
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@contextmanager
def worker_paused(up: UpProcess) -> Iterator[None]:
    """SIGSTOP the worker process: entries wait in the stream, as behind a busy worker."""
    with service_stopped(up, "worker"):
        yield


def test_health_metadata_and_config(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("mlp")
    assert not client.is_model_ready("nope")
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert meta["outputs"][0]["shape"] == ["-1", "3"]
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["max_batch_size"] == 32
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert client.get_server_metadata(as_json=True)["name"] == "tiermesh"


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_results_equal_onnxruntime(mesh_up: UpProcess, rows: int) -> None:
    x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
    client = grpcclient.InferenceServerClient(mesh_up.url)
    result = client.infer("mlp", [mlp_input(x)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(mesh_up, x), rtol=1e-6)
    params = result.get_response(as_json=True)["parameters"]
    assert "tiermesh.compute_ms" in params


def test_text_round_trip(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    text = np.array([["héllo wörld"], ["二"]], dtype=np.object_)
    inp = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
    inp.set_data_from_numpy(text)
    out = client.infer("echo", [inp]).as_numpy("ECHO")
    assert [[v.decode() for v in row] for row in out] == [["héllo wörld"], ["二"]]


def concurrent_mlp_calls(url: str, inputs: list[np.ndarray]) -> list[Any]:
    """One mlp call per input, all at once (request ids r0, r1, ...); the results in order."""

    async def main() -> list[Any]:
        client = aioclient.InferenceServerClient(url)
        try:
            calls = []
            for i, x in enumerate(inputs):
                inp = aioclient.InferInput("INPUT0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                calls.append(client.infer("mlp", [inp], request_id=f"r{i}"))
            return list(await asyncio.gather(*calls))
        finally:
            await client.close()

    return asyncio.run(main())


def test_200_concurrent_requests_answered_once_without_cross_talk(mesh_up: UpProcess) -> None:
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(200)]
    expected = [reference(mesh_up, x) for x in inputs]
    results = concurrent_mlp_calls(mesh_up.url, inputs)
    assert [r.get_response().id for r in results] == [f"r{i}" for i in range(200)]
    for result, want in zip(results, expected, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), want, rtol=1e-6)
    batch_sizes = [r.get_response().parameters["tiermesh.batch_size"].int64_param for r in results]
    assert max(batch_sizes) > 3, "concurrent requests should have been batched together"


def _raw_request(model: str, name: str, datatype: str, shape: list[int], raw: bytes) -> Any:
    req = service_pb2.ModelInferRequest(model_name=model)
    req.inputs.add(name=name, datatype=datatype, shape=shape)
    req.raw_input_contents.append(raw)
    return req


FOUR = np.ones((1, 4), dtype=np.float32).tobytes()
MALFORMED = {
    "shape": (_raw_request("mlp", "INPUT0", "FP32", [1, 4, 1], FOUR), "rank"),
    "dims": (_raw_request("mlp", "INPUT0", "FP32", [4, 1], FOUR), "dimension 1"),
    "dtype": (_raw_request("mlp", "INPUT0", "FP64", [1, 4], FOUR * 2), "datatype FP64"),
    "byte size": (_raw_request("mlp", "INPUT0", "FP32", [1, 4], FOUR[:-1]), "byte size 15"),
    "batch": (
        _raw_request("mlp", "INPUT0", "FP32", [33, 4], FOUR * 33),
        "exceeds max_batch_size 32",
    ),
    "input name": (_raw_request("mlp", "INPUT9", "FP32", [1, 4], FOUR), "unknown input"),
    "bytes framing": (
        _raw_request("echo", "TEXT", "BYTES", [1, 1], struct.pack("<I", 10) + b"abc"),
        "BYTES framing",
    ),
    "utf-8": (
        _raw_request("echo", "TEXT", "BYTES", [1, 1], struct.pack("<I", 2) + b"\xff\xfe"),
        "UTF-8",
    ),
}


def assert_malformed_is_invalid(url: str, case: str) -> None:
    """MALFORMED[case] sent to `url` comes back INVALID_ARGUMENT with its words."""
    request, words = MALFORMED[case]
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in info.value.details()


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_requests_are_invalid_argument(mesh_up: UpProcess, case: str) -> None:
    assert_malformed_is_invalid(mesh_up.url, case)


def test_unknown_model_is_not_found(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no-such-model", [mlp_input(np.ones((1, 4), np.float32))])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("mlp", model_version="7")
    assert info.value.status() == "StatusCode.NOT_FOUND"


def test_passed_timeout_is_deadline_exceeded_before_the_queue(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], timeout=1)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"


def _eventually_spans(up: UpProcess, name: str, key: str, value: str) -> list[dict[str, Any]]:
    """Spans are written when they end, which may be just after the caller got its answer:
    poll the span files, bounded."""
    deadline = time.monotonic() + 10
    while not (found := _spans_named(up, name, key, value)):
        assert time.monotonic() < deadline, f"no span {name} with {key}={value}"
        time.sleep(0.05)
    return found


def _spans_named(up: UpProcess, name: str, key: str, value: str) -> list[dict[str, Any]]:
    return [s for s in up.spans() if s["name"] == name and s["attributes"].get(key) == value]


def test_request_expired_in_queue_is_never_computed(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    x = np.ones((1, 4), np.float32)
    with worker_paused(mesh_up):
        with pytest.raises(InferenceServerException) as info:
            client.infer("mlp", [mlp_input(x)], timeout=300_000, request_id="expires")
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    gateway_span = _eventually_spans(
        mesh_up,
        "/inference.GRPCInferenceService/ModelInfer",
        "tiermesh.client_request_id",
        "expires",
    )
    request_id = gateway_span[0]["attributes"]["tiermesh.request_id"]
    # The worker, resumed, reads the entry and drops it: wait until it says so.
    deadline = time.monotonic() + 30
    while not _spans_named(mesh_up, "expired", "tiermesh.request_id", request_id):
        assert time.monotonic() < deadline, "worker never dropped the expired request"
        client.infer("mlp", [mlp_input(x)])  # one round trip lets the worker move on
    assert not _spans_named(mesh_up, "compute", "tiermesh.request_id", request_id)


def test_full_queue_is_resource_exhausted_quickly(mesh_up: UpProcess) -> None:
    x = np.ones((1, 4), np.float32)
    client = grpcclient.InferenceServerClient(mesh_up.url)
    stream = StreamKey(ComputeUnit("mlp_bounded", "1", "fp32"), "center", 2, 0).name
    queue = connect_sync(mesh_up.redis_url())
    # The pool outlives the pause: its exit waits for answers that need the worker.
    with ThreadPoolExecutor(2) as pool, worker_paused(mesh_up):
        # mlp_bounded has queue_bound 2: two requests wait in the stream...
        waiting = [pool.submit(client.infer, "mlp_bounded", [mlp_input(x)]) for _ in range(2)]
        deadline = time.monotonic() + 20
        while queue.xlen(stream) < 2:
            assert time.monotonic() < deadline, "the two requests never reached the queue"
            time.sleep(0.01)
        # ...so the third is refused at once.
        with grpc.insecure_channel(mesh_up.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = _raw_request("mlp_bounded", "INPUT0", "FP32", [1, 4], x.tobytes())
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                stub.ModelInfer(request, timeout=5)
            elapsed = time.monotonic() - started
    queue.close()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert elapsed < 0.5
    assert "full" in info.value.details()
    trailers = dict(info.value.trailing_metadata() or ())
    assert int(trailers["retry-after-ms"]) > 0
    for fut in waiting:  # accepted before the bound: answered once the worker resumes
        np.testing.assert_allclose(
            fut.result(timeout=30).as_numpy("OUTPUT0"), reference(mesh_up, x), rtol=1e-6
        )


def test_one_trace_spans_every_hop(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], request_id="traced")
    root = _eventually_spans(
        mesh_up,
        "/inference.GRPCInferenceService/ModelInfer",
        "tiermesh.client_request_id",
        "traced",
    )[0]
    trace_id = root["context"]["trace_id"]
    services = {
        s["resource"]["attributes"]["service.name"]
        for s in mesh_up.spans()
        if s["context"]["trace_id"] == trace_id
    }
    # mlp has no output step: its worker delivers the result itself (postprocess's span is
    # the worker's), tests/integration/test_trace.py has the trace through postprocess. The
    # default mesh's Go front door queues mlp's jobs itself (core/direct_plan.py): the route
    # span is then the gateway's; without the door the router places them.
    placer = "tiermesh-gateway" if door_places(mesh_up) else "tiermesh-router"
    assert services == {"tiermesh-gateway", placer, "tiermesh-worker"}
    spans = [s for s in mesh_up.spans() if s["context"]["trace_id"] == trace_id]
    names = {s["name"] for s in spans}
    assert {"route", "queue wait", "compute", "postprocess", "deliver"} <= names
    route = next(s for s in spans if s["name"] == "route")
    assert route["resource"]["attributes"]["service.name"] == placer


PARTS = (
    "tiermesh.preprocess_ms",
    "tiermesh.queue_ms",
    "tiermesh.batch_wait_ms",
    "tiermesh.compute_ms",
    "tiermesh.postprocess_ms",
    "tiermesh.delivery_ms",
)


def timed_call(client: grpcclient.InferenceServerClient, request_id: str) -> dict[str, Any]:
    """The response parameters of one mlp call (the time breakdown among them)."""
    result = client.infer("mlp", [mlp_input(np.ones((2, 4), np.float32))], request_id=request_id)
    return {
        k: next(iter(v.values()))
        for k, v in result.get_response(as_json=True)["parameters"].items()
    }


def test_response_breakdown_adds_up_and_matches_the_span(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    calls = [timed_call(client, "timed"), *(timed_call(client, f"again{i}") for i in range(4))]
    params = calls[0]
    for call in calls:
        assert all(call[k] >= 0 for k in PARTS)
        assert call["tiermesh.total_ms"] >= sum(call[k] for k in PARTS)
    # What the parts leave out is the answer's last step (delivered -> responded): well under
    # a millisecond, unless the shared machine stalled the process just then; one call of
    # five without a stall shows it (a stage missing from the parts would show in every one).
    assert min(c["tiermesh.total_ms"] - sum(c[k] for k in PARTS) for c in calls) <= 1.0
    assert params["tiermesh.tier"] == "center" and params["tiermesh.variant"] == "fp32"
    assert int(params["tiermesh.batch_size"]) >= 2 and int(params["tiermesh.bucket"]) == 0
    assert params["tiermesh.worker"]
    span = _eventually_spans(
        mesh_up,
        "/inference.GRPCInferenceService/ModelInfer",
        "tiermesh.client_request_id",
        "timed",
    )[0]
    for key in (*PARTS, "tiermesh.total_ms", "tiermesh.worker", "tiermesh.tier"):
        assert span["attributes"][key] == params[key], key


def public_metrics(up: UpProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The gateway's metrics, with the Go front door's request counts added where it holds
    the public port (the door counts the calls it answered, the gateway those passed on to
    it; the gateway's histograms count both, the door's calls from its books)."""
    urls = up.metrics_urls()
    out = scrape_metrics(urls["gateway"])
    if door_serves(up):
        for key, value in scrape_metrics(urls["frontdoor"]).items():
            if key[0] == "tiermesh_requests_total":
                out[key] = out.get(key, 0) + value
    return out


def test_metrics_count_the_request_under_its_labels(mesh_up: UpProcess) -> None:
    urls = mesh_up.metrics_urls()
    # The default `up` (spans written, the default sampler): the Go door on the public port.
    assert set(urls) == {"frontdoor", "gateway", "router", "worker", "postprocess"}
    before = public_metrics(mesh_up)
    ok = ("tiermesh_requests_total", frozenset({("model", "mlp"), ("code", "OK")}))
    client = grpcclient.InferenceServerClient(mesh_up.url)
    client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], priority=1)
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [mlp_input(np.ones((1, 4), np.float64).astype(np.float32))], timeout=1)
    after = public_metrics(mesh_up)
    assert after[ok] == before.get(ok, 0) + 1
    late = ("tiermesh_requests_total", frozenset({("model", "mlp"), ("code", "DEADLINE_EXCEEDED")}))
    assert after[late] == before.get(late, 0) + 1
    labels = frozenset(
        {
            ("model", "mlp"),
            ("tier", "center"),
            ("priority", "1"),
            ("bucket", "0"),
            ("variant", "fp32"),
        }
    )
    queued = ("tiermesh_queue_duration_seconds_count", labels)
    timed = ("tiermesh_request_duration_seconds_count", labels)

    def booked() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        m = public_metrics(mesh_up)
        return m if m.get(queued, 0) > before.get(queued, 0) else None

    # The door's calls reach the gateway's histograms through its books, a moment later.
    after = eventually(booked, "the call in the gateway's histograms")
    assert after[queued] == before.get(queued, 0) + 1
    assert after[timed] == before.get(timed, 0) + 1
    assert ("process_resident_memory_bytes", frozenset()) in after
    worker = scrape_metrics(urls["worker"])
    rows = [
        v
        for (name, lab), v in worker.items()
        if name == "tiermesh_rows_computed_total" and ("model", "mlp") in lab
    ]
    assert sum(rows) >= 1
    router = scrape_metrics(urls["router"])
    depth = [lab for (name, lab) in router if name == "tiermesh_queue_depth"]
    assert any(("model", "mlp") in lab and ("priority", "1") in lab for lab in depth)


def test_health_checks_stay_out_of_traces(mesh_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh_up.url)
    client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], request_id="after-health")
    _eventually_spans(
        mesh_up,
        "/inference.GRPCInferenceService/ModelInfer",
        "tiermesh.client_request_id",
        "after-health",
    )
    # `tiermesh up` polled every service's grpc.health.v1 at start: none of it was traced.
    assert not [s for s in mesh_up.spans() if "grpc.health" in s["name"]]
