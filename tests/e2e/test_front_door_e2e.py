"""The Go front door (TIERMESH_FRONT_DOOR=go) in front of the whole mesh, called through
tritonclient unmodified: what it answers itself equals what the Python gateway answers for
the same request; everything else (a bad request, another RPC, a stream) reaches the Python
gateway behind it byte for byte and comes back with that gateway's own code and words."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import os
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import DRIFTING, GOOD
from tests.e2e.conftest import UpProcess, running, scrape_metrics, single_redis, start_up
from tests.e2e.test_capture_replay_e2e import tm as bench_cli
from tests.e2e.test_requests_e2e import (
    MALFORMED,
    _eventually_spans,
    _raw_request,
    assert_malformed_is_invalid,
    concurrent_mlp_calls,
    mlp_input,
    reference,
    service_stopped,
    worker_paused,
)
from tests.e2e.test_rollout_e2e import MODEL as ROLLOUT_MODEL
from tests.e2e.test_rollout_e2e import cli as rollout_cli
from tests.go_toolchain import needs_go
from tests.polling import eventually
from tiermesh.bench import replay
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.keys import cancel_key, model_tag, rollout_key
from tiermesh.core.redis_client import connect, connect_sync
from tiermesh.core.wire import decode_job
from tiermesh.gateway.books import MODEL_INFER
from tiermesh.rollout.state import RolloutState
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import WindowStats, window_seconds

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_go,
]

MAX_IN_FLIGHT = 16


@pytest.fixture(scope="module")
def door_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    # No span files: the door's own figures, without the cost of writing spans.
    with running(
        tmp_path_factory.mktemp("door"),
        # The fixed cap alone: these tests fill it on purpose (a paused worker, a stopped
        # Redis), which the adaptive limits would read as a standing queue and shrink to
        # their floor for the tests after (test_adaptive_limit.py, test_door_limits.py and
        # test_overload_e2e.py test those).
        extra_env={
            "TIERMESH_FRONT_DOOR": "go",
            "TIERMESH_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT),
            "TIERMESH_ADAPTIVE_LIMIT": "false",
        },
        span_files=False,
    ) as up:
        yield up


def behind(up: UpProcess) -> str:
    """The Python gateway's own address, from the door's first line."""
    found = re.search(r"frontdoor: serving on \S+ .*Python gateway (\S+)\)", up.log.read_text())
    assert found, "the front door never said it was serving"
    return found.group(1)


def answered_calls(up: UpProcess, service: str = "gateway") -> dict[tuple[str, str], float]:
    """ModelInfer calls the Python gateway (or the front door) answered, by (model, code)."""
    calls = {}
    for (name, pairs), value in scrape_metrics(up.metrics_urls()[service]).items():
        if name == "tiermesh_requests_total":
            labels = dict(pairs)
            calls[(labels["model"], labels["code"])] = value
    return calls


def door_metric(up: UpProcess, name: str, **labels: str) -> float:
    """One series of the front door's metrics (0 before its first sample)."""
    samples = scrape_metrics(up.metrics_urls()["frontdoor"])
    return samples.get((name, frozenset(labels.items())), 0.0)


def door_in_flight(up: UpProcess) -> float:
    """The front door's `tiermesh_requests_in_flight` gauge."""
    return door_metric(up, "tiermesh_requests_in_flight")


def kinds(response: Any) -> dict[str, str]:
    """Each response parameter's name and kind (double_param, int64_param, ...)."""
    return {k: p.WhichOneof("parameter_choice") for k, p in response.parameters.items()}


def test_the_door_answers_as_the_python_gateway_does(door_up: UpProcess) -> None:
    x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
    before = answered_calls(door_up)
    door_before = answered_calls(door_up, "frontdoor")
    door = grpcclient.InferenceServerClient(door_up.url)
    python = grpcclient.InferenceServerClient(behind(door_up))
    at_door = door.infer("mlp", [mlp_input(x)], request_id="door-1", priority=1, timeout=10**7)
    at_python = python.infer("mlp", [mlp_input(x)], request_id="door-1", priority=1, timeout=10**7)
    np.testing.assert_allclose(at_door.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    np.testing.assert_array_equal(at_door.as_numpy("OUTPUT0"), at_python.as_numpy("OUTPUT0"))
    door_resp, python_resp = at_door.get_response(), at_python.get_response()
    assert (door_resp.id, door_resp.model_name, door_resp.model_version) == (
        python_resp.id,
        python_resp.model_name,
        python_resp.model_version,
    )
    assert kinds(door_resp) == kinds(python_resp)
    assert door_resp.parameters["tiermesh.batch_size"].int64_param == 5  # its rows, alone
    # Only the call made to the Python gateway directly reached it; the door counted its own.
    after = answered_calls(door_up)
    assert after.get(("mlp", "OK"), 0) - before.get(("mlp", "OK"), 0) == 1
    door_after = answered_calls(door_up, "frontdoor")
    assert door_after.get(("mlp", "OK"), 0) - door_before.get(("mlp", "OK"), 0) == 1


def test_text_and_concurrent_calls_come_back_to_their_callers(door_up: UpProcess) -> None:
    rng = np.random.default_rng(11)
    inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(MAX_IN_FLIGHT)]
    results = concurrent_mlp_calls(door_up.url, inputs)
    assert [r.get_response().id for r in results] == [f"r{i}" for i in range(len(inputs))]
    for result, x in zip(results, inputs, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    client = grpcclient.InferenceServerClient(door_up.url)
    text = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([["héllo wörld"], ["二"]], dtype=np.object_))
    out = client.infer("echo", [text]).as_numpy("ECHO")
    assert [[v.decode() for v in row] for row in out] == [["héllo wörld"], ["二"]]


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_bad_request_gets_the_python_gateway_s_own_answer(door_up: UpProcess, case: str) -> None:
    before = answered_calls(door_up)
    assert_malformed_is_invalid(door_up.url, case)
    after = answered_calls(door_up)
    key = (MALFORMED[case][0].model_name, "INVALID_ARGUMENT")
    assert after.get(key, 0) - before.get(key, 0) == 1
    # Admitted from its head, passed on for its body: its slot came back.
    assert door_in_flight(door_up) == 0


def test_every_other_call_passes_through(door_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(door_up.url)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and not client.is_model_ready("nope")
    assert client.get_server_metadata(as_json=True)["name"] == "tiermesh"
    meta = client.get_model_metadata("mlp", as_json=True)
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]
    assert client.get_model_config("mlp", as_json=True)["config"]["max_batch_size"] == 32
    assert "model_stats" in client.get_inference_statistics("mlp", as_json=True)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no-such-model", [mlp_input(np.ones((1, 4), np.float32))])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    with grpc.insecure_channel(door_up.url) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        # A stream passes through both ways: two requests, two answers, in order.
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        xs = [np.full((1, 4), v, np.float32) for v in (1.0, 2.0)]
        requests = [_raw_request("mlp", "INPUT0", "FP32", [1, 4], x.tobytes()) for x in xs]
        for i, req in enumerate(requests):
            req.id = f"s{i}"
        answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
    assert [a.infer_response.id for a in answers] == ["s0", "s1"]
    for answer, x in zip(answers, xs, strict=True):
        assert not answer.error_message
        got = np.frombuffer(answer.infer_response.raw_output_contents[0], np.float32)
        np.testing.assert_allclose(got.reshape(1, 3), reference(door_up, x), rtol=1e-6)


@contextlib.contextmanager
def door_full(up: UpProcess, x: np.ndarray) -> Iterator[list[Any]]:
    """The worker paused and MAX_IN_FLIGHT calls of `x` held at the door (its gauge says
    when): every further call is refused. Yields the held calls' futures, answered once the
    worker resumes."""
    client = grpcclient.InferenceServerClient(up.url)
    with ThreadPoolExecutor(MAX_IN_FLIGHT) as pool:
        with worker_paused(up):
            held = [
                pool.submit(client.infer, "mlp", [mlp_input(x)], client_timeout=60)
                for _ in range(MAX_IN_FLIGHT)
            ]
            deadline = time.monotonic() + 20
            while door_in_flight(up) < MAX_IN_FLIGHT:
                assert time.monotonic() < deadline, "the held calls never reached the door"
                time.sleep(0.02)
            yield held
        for fut in held:
            fut.result(timeout=30)


def test_deadlines_and_refusals_at_the_door(door_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(door_up.url)
    x = np.ones((1, 4), np.float32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [mlp_input(x)], timeout=1)  # 1 us: gone before it is routed
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    request = _raw_request("mlp", "INPUT0", "FP32", [1, 4], x.tobytes())
    with worker_paused(door_up):
        # Waiting on a paused worker: the door's own deadline ends the call.
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            client.infer("mlp", [mlp_input(x)], timeout=300_000)
        assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert time.monotonic() - started < 5
    # The door holds MAX_IN_FLIGHT calls; the next is refused at once, with advice.
    with door_full(door_up, x) as held, grpc.insecure_channel(door_up.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as over:
            stub.ModelInfer(request, timeout=5)
        refused = over.value
        # Refused from its head: tensors the gateway would reject are never read.
        with pytest.raises(grpc.RpcError) as over:
            stub.ModelInfer(MALFORMED["byte size"][0], timeout=5)
        assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "too many requests in flight" in (refused.details() or "")
    assert answered_calls(door_up, "frontdoor")[("mlp", "RESOURCE_EXHAUSTED")] >= 1
    assert int(dict(refused.trailing_metadata() or ())["retry-after-ms"]) > 0
    for fut in held:  # held before the cap: answered once the worker resumes
        np.testing.assert_allclose(
            fut.result(timeout=30).as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6
        )


def test_ctrl_c_stops_the_door_first_and_every_process_cleanly(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    up = start_up(
        tmp_path_factory.mktemp("door-stop"),
        extra_env={"TIERMESH_FRONT_DOOR": "go"},
        span_files=False,
    )
    client = grpcclient.InferenceServerClient(up.url)
    for _ in range(3):
        client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))])
    assert up.interrupt() == 0
    log = up.log.read_text()
    assert "frontdoor: stopped: 3 requests answered here" in log
    stopped = re.search(r"tiermesh up: stopped (\{.*\})", log)
    assert stopped, log[-2000:]
    codes = ast.literal_eval(stopped.group(1))
    assert list(codes)[:2] == ["frontdoor", "gateway"]
    assert set(codes.values()) == {0}


def placed(up: UpProcess, by: str) -> float:
    """Jobs of models with a placement plan that the door (or, after all, the router) queued."""
    return door_metric(up, "tiermesh_front_door_placed_total", by=by)


@contextlib.contextmanager
def placed_by_router(up: UpProcess, model: str) -> Iterator[None]:
    """The model has a rollout record (no rollout running), which the door's placement
    checks job by job: meanwhile the router places every job of it."""
    store = connect_sync(up.redis_url())
    store.hset(rollout_key(model), mapping=RolloutState(model=model, stable="1").to_fields())
    try:
        yield
    finally:
        store.delete(rollout_key(model))
        store.close()


def queued_jobs(up: UpProcess, model: str) -> list[Job]:
    """The jobs waiting in the model's work streams, oldest first."""
    store = connect_sync(up.redis_url())
    try:
        entries = [
            (entry_id, fields)
            for name in store.scan_iter(match=f"tm:q:{model_tag(model)}@*")
            for entry_id, fields in store.xrange(name)
        ]
    finally:
        store.close()
    ordered = sorted(entries, key=lambda e: tuple(int(p) for p in e[0].split(b"-")))
    return [decode_job(fields[b"job"]) for _, fields in ordered]


@single_redis
def test_the_door_queues_plain_jobs_itself_as_the_router_would(door_up: UpProcess) -> None:
    """mlp has a placement plan (no text or rollout): the door queues its jobs on the
    router's stream with the router's fields; while a rollout record exists, the router
    places them."""
    client = grpcclient.InferenceServerClient(door_up.url)
    public = client.get_model_config("mlp", as_json=True)["config"].get("parameters", {})
    assert "tiermesh.direct" not in public  # the plan is the door's, asked with its header
    by_door, by_router = placed(door_up, "door"), placed(door_up, "router")
    x = np.random.default_rng(8).standard_normal((2, 4)).astype(np.float32)
    call = lambda rid: client.infer(  # noqa: E731
        "mlp", [mlp_input(x)], request_id=rid, priority=1, client_timeout=60
    )
    with ThreadPoolExecutor(2) as pool:
        with worker_paused(door_up):
            direct = pool.submit(call, "direct")
            eventually(lambda: len(queued_jobs(door_up, "mlp")) == 1, "not queued by the door")
            with placed_by_router(door_up, "mlp"):
                routed = pool.submit(call, "routed")
                eventually(lambda: len(queued_jobs(door_up, "mlp")) == 2, "nor by the router")
            jobs = queued_jobs(door_up, "mlp")
        answers = [direct.result(), routed.result()]
    for answer in answers:
        np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    assert [j.client_request_id for j in jobs] == ["direct", "routed"]
    assert placed(door_up, "door") - by_door == 1
    assert placed(door_up, "router") - by_router == 1

    def placement(job: Job) -> Job:  # what differs between two calls of the same request
        return dataclasses.replace(
            job, request_id="", client_request_id="", deadline_ns=0, timing=Timing()
        )

    assert placement(jobs[0]) == placement(jobs[1])
    assert (jobs[0].version, jobs[0].priority, jobs[0].tier) == ("1", 1, "center")
    for job in jobs:
        assert job.timing.routed_ns >= job.timing.received_ns > 0
        assert job.timing.enqueued_ns >= job.timing.routed_ns


@single_redis
def test_jobs_that_come_while_an_admission_call_is_out_go_in_the_next_one(
    door_up: UpProcess,
) -> None:
    """While Redis holds the door's first admission call, the calls that come meanwhile
    wait for it and then go together: every job queued by the door, in two script calls at
    most, each answer its own caller's."""
    rng = np.random.default_rng(21)
    inputs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(MAX_IN_FLIGHT)]
    samples = lambda: scrape_metrics(door_up.metrics_urls()["frontdoor"])  # noqa: E731
    calls_before = samples()[("tiermesh_front_door_admission_calls_total", frozenset())]
    by_door = placed(door_up, "door")
    with ThreadPoolExecutor(1) as pool:
        with service_stopped(door_up, "redis"):  # its first call waits in Redis
            sent = pool.submit(concurrent_mlp_calls, door_up.url, inputs)
            eventually(lambda: door_in_flight(door_up) == len(inputs), "the calls never came")
        results = sent.result(timeout=60)
    assert [r.get_response().id for r in results] == [f"r{i}" for i in range(len(inputs))]
    for result, x in zip(results, inputs, strict=True):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    assert placed(door_up, "door") - by_door == len(inputs)
    calls = samples()[("tiermesh_front_door_admission_calls_total", frozenset())] - calls_before
    assert 1 <= calls <= 2


TEXT_MODEL = "minilm-l3"


def text_input(texts: list[str]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("text", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    return tensor


@single_redis
def test_the_door_tokenizes_a_text_models_jobs_and_queues_them_as_the_router_would(
    fetched_models: tuple[str, ...], tmp_path: Path
) -> None:
    """The door tokenizes ASCII texts itself (frontdoor/go/wordpiece.go) and queues the job
    the router would have queued, on the tier the router would choose (minilm-l3 as the
    repository has it, with tiers): the same token ids, mask and `truncated`; a text that
    is not ASCII goes to the router."""
    with running(
        tmp_path,
        fetched=(TEXT_MODEL,),
        extra_env={"TIERMESH_FRONT_DOOR": "go"},
        span_files=False,
    ) as up:
        client = grpcclient.InferenceServerClient(up.url)
        texts = ["Hello, World! [SEP] tokenizers", "a second text,\tLONGER than the first one"]
        by_door, by_router = placed(up, "door"), placed(up, "router")
        call = lambda rid: client.infer(  # noqa: E731
            TEXT_MODEL, [text_input(texts)], request_id=rid, client_timeout=60
        )
        with ThreadPoolExecutor(2) as pool:
            with worker_paused(up):
                direct = pool.submit(call, "direct")
                eventually(lambda: len(queued_jobs(up, TEXT_MODEL)) == 1, "not queued by the door")
                with placed_by_router(up, TEXT_MODEL):
                    routed = pool.submit(call, "routed")
                    eventually(lambda: len(queued_jobs(up, TEXT_MODEL)) == 2, "nor by the router")
                jobs = queued_jobs(up, TEXT_MODEL)
            answers = [direct.result(), routed.result()]
        assert placed(up, "door") - by_door == 1
        assert placed(up, "router") - by_router == 1
        assert [j.client_request_id for j in jobs] == ["direct", "routed"]

        def placement(job: Job) -> Job:
            return dataclasses.replace(
                job, request_id="", client_request_id="", deadline_ns=0, timing=Timing()
            )

        assert placement(jobs[0]) == placement(jobs[1])
        assert [t.name for t in jobs[0].inputs] == ["input_ids", "attention_mask"]
        assert jobs[0].inputs[0].shape == (2, 11) and jobs[0].annotations["truncated"] == "false"
        # 2 x 11 tokens: light, for the edge tier, which has no worker here; so center
        assert jobs[0].tier == "center"
        vectors = [a.as_numpy("sentence_embedding") for a in answers]
        np.testing.assert_allclose(vectors[0], vectors[1], rtol=1e-5, atol=1e-6)
        assert vectors[0].shape == (2, 384)
        client.infer(TEXT_MODEL, [text_input(["caf\u00e9 cr\u00e8me"])], client_timeout=60)
        assert placed(up, "router") - by_router == 2  # not ASCII: the router's tokenizer


def test_a_killed_router_is_reached_again_on_a_new_stream(door_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(door_up.url)
    x = np.ones((1, 4), np.float32)
    with placed_by_router(door_up, "mlp"):
        client.infer("mlp", [mlp_input(x)])  # the door's RouteStream is open
        router = door_up.children()["router"]
        os.kill(router, signal.SIGKILL)
        seen: set[str] = set()
        deadline = time.monotonic() + 60
        while True:  # `up` restarts the router after its backoff; the door dials it again
            try:
                result = client.infer("mlp", [mlp_input(x)], client_timeout=5)
                break
            except InferenceServerException as exc:
                seen.add(str(exc.status()))
            assert time.monotonic() < deadline, f"no answer after the router's restart: {seen}"
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    assert door_up.children()["router"] != router
    assert seen <= {"StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"}, seen


def mlp_statistics(up: UpProcess) -> tuple[int, int, int]:
    """(successes, failures, inferences) of mlp in the gateway's ModelStatistics."""
    client = grpcclient.InferenceServerClient(up.url)
    doc = client.get_inference_statistics("mlp", as_json=True)["model_stats"]
    stats = [s.get("inference_stats", {}) for s in doc]
    return (
        sum(int(s.get("success", {}).get("count", 0)) for s in stats),
        sum(int(s.get("fail", {}).get("count", 0)) for s in stats),
        sum(int(s.get("inference_count", 0)) for s in doc),
    )


def mlp_latencies(up: UpProcess) -> float:
    """How many mlp answers the gateway's latency histogram holds."""
    return sum(
        value
        for (name, pairs), value in scrape_metrics(up.metrics_urls()["gateway"]).items()
        if name == "tiermesh_request_duration_seconds_count" and dict(pairs)["model"] == "mlp"
    )


def books_balance(up: UpProcess) -> bool:
    """Whether the gateway's ModelStatistics and latency histogram of mlp hold every call
    the door and the gateway ended (by their own request counters)."""
    ended: dict[tuple[str, str], float] = {}
    for service in ("gateway", "frontdoor"):
        for key, n in answered_calls(up, service).items():
            ended[key] = ended.get(key, 0) + n
    ok = ended.get(("mlp", "OK"), 0)
    failed = sum(n for (model, code), n in ended.items() if model == "mlp" and code != "OK")
    successes, failures, _ = mlp_statistics(up)
    return (successes, failures) == (ok, failed) and mlp_latencies(up) == ok


def test_the_gateway_books_what_the_door_answered(door_up: UpProcess) -> None:
    eventually(lambda: books_balance(door_up), "earlier calls never all reached the books")
    successes, failures, inferences = mlp_statistics(door_up)
    door_before = answered_calls(door_up, "frontdoor").get(("mlp", "OK"), 0)
    client = grpcclient.InferenceServerClient(door_up.url)
    for rows in (1, 2, 3):
        client.infer("mlp", [mlp_input(np.ones((rows, 4), np.float32))])
    with pytest.raises(InferenceServerException):  # refused by the door itself: a failure
        client.infer("mlp", [mlp_input(np.ones((1, 4), np.float32))], timeout=1)
    assert answered_calls(door_up, "frontdoor").get(("mlp", "OK"), 0) - door_before == 3
    # Booked at the Python gateway within moments: ModelStatistics and the histograms.
    eventually(
        lambda: mlp_statistics(door_up) == (successes + 3, failures + 1, inferences + 6),
        f"the door's calls never reached the gateway's statistics: {mlp_statistics(door_up)}",
    )
    eventually(lambda: books_balance(door_up), "nor its latency histogram")


BOOKS_GATHER_S = 0.05  # books.go's booksGather
CAPTURE_PROBE_S = 0.25  # books.go's captureProbeEvery

BOOKS_CALLS = "tiermesh_front_door_books_calls_total"  # the door's Record calls so far


def test_a_flow_of_refusals_is_booked_once_a_gather(door_up: UpProcess) -> None:
    """Refusals one after another for a second reach the gateway's books in one Record
    call a gather, not one per round trip (which kept the gateway booking all the time)."""
    x = np.ones((1, 4), np.float32)
    request = _raw_request("mlp", "INPUT0", "FP32", [1, 4], x.tobytes())
    refused = 0
    with door_full(door_up, x), grpc.insecure_channel(door_up.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        before = door_metric(door_up, BOOKS_CALLS)
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < 1.0:
            with pytest.raises(grpc.RpcError) as over:
                stub.ModelInfer(request, timeout=5)
            assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            refused += 1
        made = door_metric(door_up, BOOKS_CALLS) - before
    # One a gather, a probe when nothing waited, and the one in flight at either end.
    bound = elapsed / BOOKS_GATHER_S + elapsed / CAPTURE_PROBE_S + 2
    assert made <= bound, (made, bound, refused)
    assert refused > 4 * bound, refused  # enough refusals that one call each would show
    eventually(lambda: books_balance(door_up), "the refusals never all reached the books")


def test_a_caller_who_leaves_is_marked_for_the_workers(door_up: UpProcess) -> None:
    store = connect_sync(door_up.redis_url())
    pattern = cancel_key("*")
    marked = set(store.scan_iter(match=pattern))
    x = np.ones((1, 4), np.float32)
    request = _raw_request("mlp", "INPUT0", "FP32", [1, 4], x.tobytes())
    with worker_paused(door_up), grpc.insecure_channel(door_up.url) as channel:
        call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(
            request, timeout=30
        )
        eventually(lambda: door_in_flight(door_up) >= 1, "the call never reached the door")
        call.cancel()  # the caller leaves while its job waits in the stream
        new = lambda: set(store.scan_iter(match=pattern)) - marked  # noqa: E731
        eventually(lambda: len(new()) == 1, f"not one job marked cancelled: {new()}")


async def rollout_window(url: str, version: str, since_ms: int) -> WindowStats:
    """What the gateways recorded of one version of the rollout model since `since_ms`."""
    redis = connect(url)
    try:
        seconds = window_seconds(time.time(), 600, since_ms)
        return await RolloutStore(redis).window(ROLLOUT_MODEL, version, seconds)
    finally:
        await redis.aclose()


def test_canary_drift_and_outcomes_count_what_the_door_answered(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A rollout of the drifting version at 0%: the door answers every call from stable,
    the router mirrors copies to the canary, and the gateway pairs the door's stable
    answers with the canary's (output drift) and counts both versions' outcomes."""
    tmp = tmp_path_factory.mktemp("door-rollout")
    env = {"TIERMESH_FRONT_DOOR": "go"}
    with running(tmp, extra_env=env, span_files=False, rollout_model=ROLLOUT_MODEL) as up:
        started_ms = int(time.time() * 1000)
        rollout_cli(up, tmp / "models", "start", "--canary", DRIFTING, "--percent", "0")
        client = grpcclient.InferenceServerClient(up.url)
        url = up.redis_url()

        def window(version: str) -> WindowStats:
            return asyncio.run(rollout_window(url, version, started_ms))

        x = np.array([[0.5, -1.0, 2.0, 0.25]], np.float32)
        deadline = time.monotonic() + 30
        while window(DRIFTING).cosine_n < 3:  # until the routers mirror and pairs compare
            answer = client.infer(ROLLOUT_MODEL, [mlp_input(x)])
            assert answer.get_response().model_version == GOOD
            assert time.monotonic() < deadline, f"no drift recorded: {window(DRIFTING)}"
        door_ok = answered_calls(up, "frontdoor").get((ROLLOUT_MODEL, "OK"), 0)
        python_ok = answered_calls(up).get((ROLLOUT_MODEL, "OK"), 0)
        canary, stable = window(DRIFTING), window(GOOD)
    assert python_ok == 0 and door_ok >= 3  # every call was the door's
    assert canary.cosine_mean is not None and canary.cosine_mean < 0.99
    assert canary.ok >= 3 and stable.ok >= 3 and stable.errors == 0


def test_traffic_capture_samples_what_the_door_answered(door_up: UpProcess, tmp_path: Path) -> None:
    url = door_up.redis_url()
    bench_cli("capture", "--redis-url", url, "clear")
    bench_cli("capture", "--redis-url", url, "start", "--rate", "1")
    python_ok = answered_calls(door_up).get(("mlp", "OK"), 0)
    client = grpcclient.InferenceServerClient(door_up.url)
    out = tmp_path / "captured.jsonl"
    try:
        deadline = time.monotonic() + 20
        while True:  # the door learns the rate within a probe of the gateway's books
            client.infer("mlp", [mlp_input(np.ones((2, 4), np.float32))], priority=1)
            bench_cli("capture", "--redis-url", url, "export", "--out", str(out))
            records = [r for r in replay.load(out) if r["model"] == "mlp"]
            if records:
                break
            assert time.monotonic() < deadline, "nothing the door answered was captured"
    finally:
        bench_cli("capture", "--redis-url", url, "stop")
    assert answered_calls(door_up).get(("mlp", "OK"), 0) == python_ok  # all the door's
    record = records[0]
    assert (record["code"], record["priority"], record["tier"]) == ("OK", 1, "center")
    assert record["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "bytes": 32}
    ]
    assert record["timing_ms"]["total"] > 0


def test_the_door_reports_its_cpu_as_every_process_does(door_up: UpProcess) -> None:
    """`tiermesh bench --mesh-metrics` and the dashboards read process_cpu_seconds_total."""
    samples = scrape_metrics(door_up.metrics_urls()["frontdoor"])
    assert samples[("process_cpu_seconds_total", frozenset())] > 0


@single_redis
def test_a_traced_call_the_door_answers_has_every_hop_on_its_trace(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The door in a mesh that writes spans (the default sampler): it answers traced calls
    itself, and the gateway writes their spans from its books as for its own calls."""
    tmp = tmp_path_factory.mktemp("door-traced")
    with running(tmp, extra_env={"TIERMESH_FRONT_DOOR": "go"}) as up:
        client = grpcclient.InferenceServerClient(up.url)
        x = np.ones((2, 4), np.float32)
        answer = client.infer("mlp", [mlp_input(x)], request_id="traced")
        caller = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
        client.infer("mlp", [mlp_input(x)], request_id="child", headers={"traceparent": caller})
        unsampled = "00-" + "ef" * 16 + "-" + "cd" * 8 + "-00"
        client.infer("mlp", [mlp_input(x)], request_id="quiet", headers={"traceparent": unsampled})
        with placed_by_router(up, "mlp"):
            client.infer("mlp", [mlp_input(x)], request_id="routed")
        assert answered_calls(up, "frontdoor")[("mlp", "OK")] == 4
        assert answered_calls(up).get(("mlp", "OK"), 0) == 0
        root = _eventually_spans(up, MODEL_INFER, "tiermesh.client_request_id", "traced")[0]
        child = _eventually_spans(up, MODEL_INFER, "tiermesh.client_request_id", "child")[0]
        routed = _eventually_spans(up, MODEL_INFER, "tiermesh.client_request_id", "routed")[0]

        def trace_of(span: dict[str, Any]) -> list[dict[str, Any]]:
            trace_id = span["context"]["trace_id"]
            return [s for s in up.spans() if s["context"]["trace_id"] == trace_id]

        on_trace = trace_of(root)
        names = {s["name"] for s in on_trace}
        spans_now = up.spans()
        by_router = trace_of(routed)

    def service(spans: list[dict[str, Any]], name: str) -> str:
        span = next(s for s in spans if s["name"] == name)
        return str(span["resource"]["attributes"]["service.name"])

    services = {s["resource"]["attributes"]["service.name"] for s in on_trace}
    assert {MODEL_INFER, "route", "queue wait", "compute", "postprocess", "deliver"} <= names
    # The door queued mlp's job itself: the route span is the gateway's; the router's when
    # the router placed it.
    assert services == {"tiermesh-gateway", "tiermesh-worker"}
    assert service(on_trace, "route") == "tiermesh-gateway"
    assert service(by_router, "route") == "tiermesh-router"
    assert service(by_router, "compute") == "tiermesh-worker"
    assert root["kind"] == "SpanKind.SERVER" and root["parent_id"] is None
    facts = root["attributes"]
    assert facts["rpc.grpc.status_code"] == 0 and facts["rpc.method"] == "ModelInfer"
    params = answer.get_response().parameters
    assert facts["tiermesh.batch_size"] == params["tiermesh.batch_size"].int64_param
    # A caller's sampled trace goes on through the door; an unsampled one gets no span.
    assert child["context"]["trace_id"] == "0x" + "ab" * 16
    assert child["parent_id"] == "0x" + "cd" * 8
    assert not [s for s in spans_now if s["context"]["trace_id"] == "0x" + "ef" * 16]
    # The door's books reach the gateway in calls of many entries: no span of their own.
    assert not [s for s in spans_now if s["name"].endswith("Books/Record")]


def test_compressed_calls_are_answered_at_the_door(door_up: UpProcess) -> None:
    """gzip and deflate, as tritonclient sends them (grpcio takes both)."""
    before = answered_calls(door_up, "frontdoor").get(("mlp", "OK"), 0)
    client = grpcclient.InferenceServerClient(door_up.url)
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    for algorithm in ("gzip", "deflate"):
        got = client.infer("mlp", [mlp_input(x)], compression_algorithm=algorithm)
        np.testing.assert_allclose(got.as_numpy("OUTPUT0"), reference(door_up, x), rtol=1e-6)
    assert answered_calls(door_up, "frontdoor").get(("mlp", "OK"), 0) - before == 2
