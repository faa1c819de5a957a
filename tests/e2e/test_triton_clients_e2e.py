"""What Triton's example clients do (simple_grpc_* and simple_http_*: infer with and without
requested outputs, async, aio, strings and the BYTES identity, health and metadata, the
unknown-model error in Triton's words, streaming, statistics), written here against
`tiermesh up` (the Python gateway, on loopback without API keys) through tritonclient
unmodified, plus curl against the v2 REST endpoint. Model control, which needs an admin
tenant's key: test_model_control_e2e.py."""

from __future__ import annotations

import json
import queue
import subprocess
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.e2e.conftest import UpProcess, start_up

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

X0 = np.arange(16, dtype=np.int32).reshape(1, 16)
X1 = np.ones((1, 16), dtype=np.int32)
# What Triton's clients look for in the message of an unknown model (tritonclient's
# examples match its start).
UNKNOWN_MODEL = "Request for unknown model"
# BYTES elements simple_identity must hand back as they came: a NUL inside an element, an
# empty one, control bytes, multi-byte UTF-8 (ONNX strings are text: UTF-8 only).
IDENTITY_ROWS = [
    [b"he\x00llo", b"", b"\x00\x01\x02\x03", "h\u00e9llo \u65e5\u672c".encode()],
    [b"a", b"\x00", b"trailing NUL\x00", b"x" * 300],
]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    up = start_up(tmp_path_factory.mktemp("triton"), up_args=["--front-door", "python"])
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def grpc_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        inp = grpcclient.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
        inp.set_data_from_numpy(x)
        inputs.append(inp)
    return inputs


def http_inputs(a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[httpclient.InferInput]:
    inputs = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        inp = httpclient.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
        inp.set_data_from_numpy(x, binary_data=binary)
        inputs.append(inp)
    return inputs


def check_sums(result: Any) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X0 + X1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), X0 - X1)


# -- gRPC ---------------------------------------------------------------------------------


def test_grpc_health_and_metadata(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple_string")
    assert client.is_model_ready("simple_identity")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "tiermesh" and "statistics" in server["extensions"]
    meta = client.get_model_metadata("simple", as_json=True)
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": ["-1", "16"]}
    config = client.get_model_config("simple", as_json=True)["config"]
    assert config["max_batch_size"] == 8
    assert config["output"][1]["name"] == "OUTPUT1"


def test_grpc_infer_with_and_without_requested_outputs(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    check_sums(client.infer("simple", grpc_inputs(X0, X1), request_id="1"))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", grpc_inputs(X0, X1), outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), X0 - X1)
    assert result.as_numpy("OUTPUT0") is None


def test_grpc_async_infer_with_callbacks(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    for i in range(4):
        client.async_infer(
            "simple",
            grpc_inputs(X0 * i, X1),
            partial(lambda result, error: done.put((result, error))),
            request_id=str(i),
        )
    for _ in range(4):
        result, error = done.get(timeout=30)
        assert error is None
        i = int(result.get_response().id)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), X0 * i + X1)


async def test_grpc_aio_infer(mesh: UpProcess) -> None:
    client = grpcaio.InferenceServerClient(mesh.url)
    try:
        assert await client.is_model_ready("simple")
        check_sums(await client.infer("simple", grpc_inputs(X0, X1)))
    finally:
        await client.close()


def test_grpc_string_infer(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    a = np.array([[str(v) for v in X0[0]]], dtype=np.object_)
    b = np.array([[str(v) for v in X1[0]]], dtype=np.object_)
    result = client.infer("simple_string", grpc_inputs(a, b))
    got0 = [int(v) for v in result.as_numpy("OUTPUT0")[0]]
    got1 = [int(v) for v in result.as_numpy("OUTPUT1")[0]]
    assert got0 == list(X0[0] + X1[0]) and got1 == list(X0[0] - X1[0])


def identity_input(module: Any, data: np.ndarray, **binary: bool) -> Any:
    inp = module.InferInput("INPUT0", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data, **binary)
    return inp


def test_grpc_bytes_identity(mesh: UpProcess) -> None:
    """simple_identity hands every element back byte for byte (NULs too), for object arrays
    and for fixed-width np.bytes_ ones, in a batch of two rows."""
    client = grpcclient.InferenceServerClient(mesh.url)
    assert client.get_model_metadata("simple_identity", as_json=True)["inputs"] == [
        {"name": "INPUT0", "datatype": "BYTES", "shape": ["-1", "-1"]}
    ]
    rows = np.array(IDENTITY_ROWS, dtype=np.object_)
    result = client.infer("simple_identity", [identity_input(grpcclient, rows)])
    got = result.as_numpy("OUTPUT0")
    assert got.shape == rows.shape and got.tolist() == rows.tolist()
    blobs = np.array([[b"\x00\x01\x02\x03"] * 16], dtype=np.bytes_)
    result = client.infer("simple_identity", [identity_input(grpcclient, blobs)])
    assert result.as_numpy("OUTPUT0").tolist() == [[b"\x00\x01\x02\x03"] * 16]


@pytest.mark.parametrize("binary", [True, False])
def test_http_bytes_identity(mesh: UpProcess, binary: bool) -> None:
    """The same through the REST door, as binary tensors and as JSON strings."""
    client = httpclient.InferenceServerClient(mesh.rest_url())
    rows = np.array(IDENTITY_ROWS, dtype=np.object_)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    inputs = [identity_input(httpclient, rows, binary_data=binary)]
    got = client.infer("simple_identity", inputs, outputs=outputs).as_numpy("OUTPUT0")
    # JSON carries text: tritonclient hands those elements back as str.
    as_bytes = [[v if isinstance(v, bytes) else str(v).encode() for v in row] for row in got]
    assert got.shape == rows.shape and as_bytes == rows.tolist()


def refusals(calls: dict[str, Callable[[], object]]) -> dict[str, tuple[str, str]]:
    """Each call's refusal: its status and message (a call that succeeds fails the test)."""
    found = {}
    for what, call in calls.items():
        with pytest.raises(InferenceServerException) as err:
            call()
        found[what] = (str(err.value.status()), str(err.value.message()))
    return found


def test_unknown_model_in_tritons_words(mesh: UpProcess) -> None:
    """Metadata, config and infer of a model the repository lacks: NOT_FOUND (HTTP 404) with
    Triton's message, which its example clients check."""
    client = grpcclient.InferenceServerClient(mesh.url)
    calls: dict[str, Callable[[], object]] = {
        "metadata": lambda: client.get_model_metadata("wrong_model_name"),
        "config": lambda: client.get_model_config("wrong_model_name"),
        "infer": lambda: client.infer("wrong_model_name", grpc_inputs(X0, X1)),
    }
    for what, (status, message) in refusals(calls).items():
        assert status == "StatusCode.NOT_FOUND", what
        assert message == f"{UNKNOWN_MODEL}: 'wrong_model_name' is not found", what
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("simple", model_version="7")
    assert err.value.message() == f"{UNKNOWN_MODEL}: 'simple' version 7 is not found"

    rest = httpclient.InferenceServerClient(mesh.rest_url())
    http_calls: dict[str, Callable[[], object]] = {
        "metadata": lambda: rest.get_model_metadata("wrong_model_name"),
        "config": lambda: rest.get_model_config("wrong_model_name"),
        "infer": lambda: rest.infer("wrong_model_name", http_inputs(X0, X1)),
    }
    for what, (status, message) in refusals(http_calls).items():
        assert status == "404", what
        assert message.startswith(UNKNOWN_MODEL), what


def test_grpc_compression(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    for algorithm in ("gzip", "deflate"):
        check_sums(client.infer("simple", grpc_inputs(X0, X1), compression_algorithm=algorithm))


def test_grpc_stream_answers_each_request_by_id(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    got: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        for i in range(6):
            client.async_stream_infer("simple", grpc_inputs(X0 + i, X1), request_id=f"s{i}")
        client.async_stream_infer("nope", grpc_inputs(X0, X1), request_id="bad")
        answers: dict[str, Any] = {}
        errors: list[str] = []
        for _ in range(7):
            result, error = got.get(timeout=30)
            if error is not None:
                errors.append(str(error))
                continue
            answers[result.get_response().id] = result
    finally:
        client.stop_stream()
    assert sorted(answers) == [f"s{i}" for i in range(6)]
    for i in range(6):
        np.testing.assert_array_equal(answers[f"s{i}"].as_numpy("OUTPUT0"), X0 + i + X1)
    assert len(errors) == 1 and f"{UNKNOWN_MODEL}: 'nope' is not found" in errors[0]


def test_grpc_statistics_count_requests_and_agree_with_the_breakdown(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)

    def stats() -> dict[str, Any]:
        doc = client.get_inference_statistics("simple", "1", as_json=True)
        return dict(doc["model_stats"][0])

    before = stats()
    breakdowns = []
    for i in range(5):
        result = client.infer("simple", grpc_inputs(X0 + i, X1))
        params = result.get_response(as_json=True)["parameters"]
        # `tiermesh.queue_ms`, ...: compared by stage name.
        breakdowns.append(
            {
                k.removeprefix("tiermesh."): v["double_param"]
                for k, v in params.items()
                if k.endswith("_ms")
            }
        )
    with pytest.raises(InferenceServerException):
        client.infer("simple", grpc_inputs(X0.astype(np.int64), X1))  # wrong datatype
    after = stats()

    def delta(field: str) -> tuple[int, int]:
        a = after["inference_stats"].get(field, {})
        b = before["inference_stats"].get(field, {})
        count = int(a.get("count", 0)) - int(b.get("count", 0))
        return count, int(a.get("ns", 0)) - int(b.get("ns", 0))

    def total_ms(*stages: str) -> float:
        return sum(sum(b.get(s, 0.0) for s in stages) for b in breakdowns)

    assert delta("success")[0] == 5 and delta("fail")[0] == 1
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == 5
    # Response parameters are milliseconds from the same ns instants: equal within rounding.
    expected = {
        "queue": total_ms("queue_ms", "batch_wait_ms"),
        "compute_input": total_ms("preprocess_ms"),
        "compute_infer": total_ms("compute_ms"),
        "compute_output": total_ms("postprocess_ms"),
        "success": total_ms("total_ms"),
    }
    for field, ms in expected.items():
        count, ns = delta(field)
        assert count == 5, field
        assert ns / 1e6 == pytest.approx(ms, abs=1e-3), field
    print(
        "statistics of 5 requests (ms): "
        + ", ".join(f"{f} {delta(f)[1] / 1e6:.3f}" for f in expected)
        + f"; breakdown sums: {', '.join(f'{f} {ms:.3f}' for f, ms in expected.items())}"
    )


# -- HTTP ---------------------------------------------------------------------------------


def test_http_health_and_metadata(mesh: UpProcess) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url())
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and not client.is_model_ready("nope")
    assert client.get_server_metadata()["name"] == "tiermesh"
    meta = client.get_model_metadata("simple")
    assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [16]


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer(mesh: UpProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url())
    outputs = [
        httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")
    ]
    check_sums(client.infer("simple", http_inputs(X0, X1, binary), outputs=outputs))
    check_sums(client.infer("simple", http_inputs(X0, X1, binary)))  # no outputs named


def test_http_async_infer(mesh: UpProcess) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url(), concurrency=4)
    pending = [client.async_infer("simple", http_inputs(X0 * i, X1)) for i in range(4)]
    for i, request in enumerate(pending):
        np.testing.assert_array_equal(request.get_result().as_numpy("OUTPUT0"), X0 * i + X1)
    client.close()


async def test_http_aio_infer(mesh: UpProcess) -> None:
    client = httpaio.InferenceServerClient(mesh.rest_url())
    try:
        assert await client.is_server_ready()
        check_sums(await client.infer("simple", http_inputs(X0, X1)))
    finally:
        await client.close()


def test_http_string_infer(mesh: UpProcess) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url())
    a = np.array([[str(v) for v in X0[0]]], dtype=np.object_)
    b = np.array([[str(v) for v in X1[0]]], dtype=np.object_)
    for binary in (True, False):
        result = client.infer("simple_string", http_inputs(a, b, binary))
        assert [int(v) for v in result.as_numpy("OUTPUT0")[0]] == list(X0[0] + X1[0])


def test_http_statistics_agree_with_grpc(mesh: UpProcess) -> None:
    client = httpclient.InferenceServerClient(mesh.rest_url())
    check_sums(client.infer("simple", http_inputs(X0, X1)))
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    grpc_stats = grpcclient.InferenceServerClient(mesh.url).get_inference_statistics(
        "simple", as_json=True
    )["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == int(
        grpc_stats["inference_stats"]["success"]["count"]
    )


# -- curl ---------------------------------------------------------------------------------


def curl(url: str, *args: str) -> tuple[int, str]:
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", *args, url],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    body, _, code = out.rpartition("\n")
    return int(code), body


def test_curl_against_the_rest_endpoint(mesh: UpProcess, tmp_path: Path) -> None:
    base = f"http://{mesh.rest_url()}/v2/models"
    doc = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": X0.tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": X1[0].tolist()},
        ]
    }
    post = ["-X", "POST", "-H", "Content-Type: application/json", "-d"]
    code, body = curl(f"{base}/simple/infer", *post, json.dumps(doc))
    assert code == 200, body
    outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"]["data"] == (X0 + X1)[0].tolist()
    assert outputs["OUTPUT1"]["data"] == (X0 - X1)[0].tolist()
    assert outputs["OUTPUT0"]["shape"] == [1, 16]

    code, body = curl(f"{base}/simple/infer", *post, '{"inputs": [')
    assert code == 400 and "malformed JSON" in json.loads(body)["error"]

    wrong = json.loads(json.dumps(doc))
    wrong["inputs"][0]["datatype"] = "FP32"
    code, body = curl(f"{base}/simple/infer", *post, json.dumps(wrong))
    assert code == 400
    assert "datatype FP32 does not match the model's INT32" in json.loads(body)["error"]

    code, body = curl(f"{base}/nope/infer", *post, json.dumps(doc))
    assert code == 404
    assert json.loads(body)["error"] == f"{UNKNOWN_MODEL}: 'nope' is not found"
    print(f"curl JSON infer of simple -> 200 {outputs['OUTPUT0']['data'][:4]}...; 404 {body}")


def test_a_rest_request_is_one_trace_across_the_mesh(mesh: UpProcess) -> None:
    """The REST door's SERVER span is the parent of the request's hops (router, worker)."""
    client = httpclient.InferenceServerClient(mesh.rest_url())
    client.infer("simple", http_inputs(X0, X1), request_id="traced")
    deadline = time.monotonic() + 20
    while True:
        spans = mesh.spans()
        rest = [s for s in spans if s["name"] == "POST /v2/models/{model}/infer"]
        traces = {s["context"]["trace_id"] for s in rest}
        names = {s["name"] for s in spans if s["context"]["trace_id"] in traces}
        if "route" in names and any("compute" in n for n in names):
            break
        assert time.monotonic() < deadline, sorted(names)
        time.sleep(0.05)
    assert rest[0]["kind"] == "SpanKind.SERVER"
