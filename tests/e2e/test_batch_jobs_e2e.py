"""A batch job of 5,000 texts on a real `tiermesh up`: every result present exactly once
and equal to the online answer for the same text, with a worker killed (kill -9) and
redis-server SIGKILLed midway (the supervisor restarts both; Redis from its AOF)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.conftest import UpProcess, fail_redis
from tests.e2e.test_faults_e2e import FAST_RECOVERY, wait_replaced
from tests.polling import eventually
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.redis_client import connect_sync
from tiermesh.core.tensors import split_bytes
from tiermesh.core.wire import tensor_from_proto
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
N = 5000


def _status(stub: batch_pb2_grpc.BatchJobsStub, job_id: str) -> batch_pb2.BatchJob | None:
    """The job's status, or None while the mesh cannot answer (Redis restarting)."""
    try:
        reply: batch_pb2.BatchJob = stub.Status(batch_pb2.JobRef(job_id=job_id), timeout=5)
        return reply
    except grpc.RpcError:
        return None


def _wait_done(stub: batch_pb2_grpc.BatchJobsStub, job_id: str, at_least: int, t: float) -> int:
    def reached() -> batch_pb2.BatchJob | None:
        s = _status(stub, job_id)
        return (
            s if s is not None and (s.done + s.errors >= at_least or s.status == "done") else None
        )

    return int(eventually(reached, f"job {job_id} to reach {at_least} results", t).done)


def _chunks(texts: list[str]) -> Iterator[batch_pb2.SubmitChunk]:
    yield batch_pb2.SubmitChunk(model="echo", texts=texts[:2500])
    yield batch_pb2.SubmitChunk(texts=texts[2500:])


def test_5000_texts_exactly_once_through_worker_and_redis_kills(
    new_up: Callable[..., UpProcess],
) -> None:
    up = new_up(extra_env=FAST_RECOVERY, span_files=False)
    texts = [f"document {i}: the quick brown fox {i % 97} jumps" for i in range(N)]
    with grpc.insecure_channel(up.url) as channel:
        stub = batch_pb2_grpc.BatchJobsStub(channel)
        job = stub.Submit(_chunks(texts), timeout=60)
        assert (job.total, job.status) == (N, "queued")

        _wait_done(stub, job.job_id, 1000, 90)
        worker = up.children()["worker"]
        os.kill(worker, signal.SIGKILL)
        wait_replaced(up, "worker", worker)

        before_redis = _wait_done(stub, job.job_id, 2500, 90)
        assert before_redis < N, "the job finished before Redis could be killed midway"
        fail_redis(up, keys.batch_job_key(job.job_id))

        _wait_done(stub, job.job_id, N, 150)
        final = _status(stub, job.job_id)
        assert final is not None
        assert (final.status, final.done, final.errors, final.fed) == ("done", N, 0, N)
        results = list(stub.Results(batch_pb2.ResultsRequest(job_id=job.job_id), timeout=60))

    # Every index exactly once, and nothing written twice in Redis (HSETNX per index).
    assert [r.index for r in results] == list(range(N))
    r = connect_sync(up.redis_url())
    assert r.hlen(keys.batch_results_key(job.job_id)) == N
    assert int(r.hget(keys.batch_job_key(job.job_id), "done") or 0) == N

    def text_of(res: batch_pb2.BatchResult) -> str:
        t = tensor_from_proto(res.outputs[0])
        return split_bytes(t.raw, 1, t.name)[0].decode()

    batch_answers = [text_of(res) for res in results]
    # Equal to the online answer for the same text (a sample through ModelInfer; the echo
    # model's online answer is the text itself, checked for all).
    assert batch_answers == texts
    client = grpcclient.InferenceServerClient(up.url)
    for i in range(0, N, 50):
        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[texts[i].encode()]], dtype=object))
        online = client.infer("echo", [inp]).as_numpy("ECHO")
        assert online is not None and online.reshape(-1)[0].decode() == batch_answers[i]


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_batch_pool_takes_the_job_at_the_lowest_cpu_priority(
    new_up: Callable[..., UpProcess],
) -> None:
    """`tiermesh up --batch-pool`: one more center worker, niced to 19, reads the job's
    background streams; the online worker reads none of them and only it is registered
    for online admission."""
    up = new_up(up_args=["--batch-pool"], span_files=False)
    children = up.children()
    assert _nice(children["worker-batch"]) == 19
    assert _nice(children["worker"]) == 0
    texts = [f"pooled document {i}" for i in range(300)]
    with grpc.insecure_channel(up.url) as channel:
        stub = batch_pb2_grpc.BatchJobsStub(channel)
        job = stub.Submit(_chunks(texts), timeout=60)
        _wait_done(stub, job.job_id, len(texts), 90)
        results = list(stub.Results(batch_pb2.ResultsRequest(job_id=job.job_id), timeout=60))
    assert [r.index for r in results] == list(range(len(texts)))
    r = connect_sync(up.redis_url())
    unit = ComputeUnit("echo", "1", "fp32")
    background = keys.background_streams(unit, "center", 1)[0].name
    readers = [c["name"] for c in r.xinfo_consumers(background, keys.GROUP)]
    assert len(readers) == 1, readers  # the pool alone
    assert r.zcard(keys.workers_key(unit, "center")) == 1  # only the online worker
    client = grpcclient.InferenceServerClient(up.url)
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"online while pooled"]], dtype=object))
    online = client.infer("echo", [inp]).as_numpy("ECHO")
    assert online is not None and online.reshape(-1)[0] == b"online while pooled"
