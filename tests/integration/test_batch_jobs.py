"""Batch jobs on the in-process mesh against the real redis-server: a small job completes
with every result written exactly once; cancelling frees its queues at once and stops its
results within one batch."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as aioclient

from tests.integration.conftest import start_mesh
from tests.polling import until
from tiermesh.batch.plan import job_streams
from tiermesh.batch.store import DEFAULT_RETENTION_S, BatchStore
from tiermesh.core import keys
from tiermesh.core.repository import ModelRepository
from tiermesh.core.tensors import split_bytes
from tiermesh.core.wire import tensor_from_proto
from tiermesh.router.batch_feeder import Feeder
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

pytestmark = pytest.mark.integration


async def _submit(stub: batch_pb2_grpc.BatchJobsStub, texts: list[str]) -> batch_pb2.BatchJob:
    async def chunks():  # type: ignore[no-untyped-def]
        yield batch_pb2.SubmitChunk(model="echo", texts=texts[: len(texts) // 2])
        yield batch_pb2.SubmitChunk(texts=texts[len(texts) // 2 :])

    reply: batch_pb2.BatchJob = await stub.Submit(chunks())
    return reply


def _echo_text(r: batch_pb2.BatchResult) -> str:
    t = tensor_from_proto(r.outputs[0])
    return split_bytes(t.raw, 1, t.name)[0].decode()


async def _assert_retained(redis: aioredis.Redis, job_id: str) -> None:
    """An ended job: inputs deleted, record and results kept for the retention period."""
    assert await redis.exists(keys.batch_inputs_key(job_id)) == 0
    for key in (keys.batch_job_key(job_id), keys.batch_results_key(job_id)):
        ttl_ms = await redis.pttl(key)
        assert 0 < ttl_ms <= DEFAULT_RETENTION_S * 1000, (key, ttl_ms)


async def test_small_job_every_result_exactly_once(redis_url: str, model_repo: Path) -> None:
    mesh = await start_mesh(redis_url, model_repo, common_overrides={"batch_max_queued": 40})
    redis = aioredis.from_url(redis_url)
    try:
        async with grpc.aio.insecure_channel(mesh.gateway) as channel:
            stub = batch_pb2_grpc.BatchJobsStub(channel)
            texts = [f"sentence number {i}" for i in range(300)]
            job = await _submit(stub, texts)
            assert job.total == 300 and job.status == "queued"

            async def done() -> bool:
                s = await stub.Status(batch_pb2.JobRef(job_id=job.job_id))
                # The feeder never has more than its bound of the job queued.
                assert s.fed - s.done - s.errors <= 40
                return bool(s.status == "done")

            await until(done, "the job to finish", 60)
            status = await stub.Status(batch_pb2.JobRef(job_id=job.job_id))
            assert (status.done, status.errors, status.fed) == (300, 0, 300)
            results = [r async for r in stub.Results(batch_pb2.ResultsRequest(job_id=job.job_id))]
            assert [r.index for r in results] == list(range(300))
            assert [_echo_text(r) for r in results] == texts
            assert all(r.code == 0 for r in results)
            # Written exactly once: a second write of an index (a redelivered input) is
            # refused and changes neither the result nor the counts.
            store = BatchStore(redis)
            assert await store.record(job.job_id, [(0, b"other", True)]) == 0
            assert (await store.results(job.job_id, 0, 1))[0][1] != b"other"
            rec = await store.get(job.job_id)
            assert rec is not None and rec.done == 300
            assert await store.result_count(job.job_id) == 300
            assert job.job_id not in await store.active()
            await _assert_retained(redis, job.job_id)
            # Another tenant's (here: an unknown) job id is not found.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Status(batch_pb2.JobRef(job_id="nope"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await redis.aclose()
        await mesh.close()


async def test_cancel_frees_queues_within_a_batch(redis_url: str, model_repo: Path) -> None:
    mesh = await start_mesh(redis_url, model_repo, common_overrides={"batch_max_queued": 200})
    redis = aioredis.from_url(redis_url)
    try:
        async with grpc.aio.insecure_channel(mesh.gateway) as channel:
            stub = batch_pb2_grpc.BatchJobsStub(channel)
            job = await _submit(stub, [f"text {i}" for i in range(20_000)])
            ref = batch_pb2.JobRef(job_id=job.job_id)

            async def started() -> bool:
                return bool((await stub.Status(ref)).done > 0)

            await until(started, "the first results", 30)
            cancelled = await stub.Cancel(ref)
            assert cancelled.status == "cancelled"
            store = BatchStore(redis)
            written = await store.result_count(job.job_id)
            cfg = ModelRepository(model_repo).load()["echo"]
            rec = await store.get(job.job_id)
            assert rec is not None
            streams = job_streams(cfg, rec)
            # Its queues are freed at once: no entry of the job is left on any stream.
            for s in streams:
                assert await redis.xlen(s.name) == 0

            async def settled() -> bool:
                pending = [await redis.xpending(s.name, keys.GROUP) for s in streams]
                return all(p["pending"] == 0 for p in pending)

            await until(settled, "the worker to drop what it had read", 10)
            # What was read but not computed is skipped; nothing more is written or fed.
            assert await store.result_count(job.job_id) == written
            after = await store.get(job.job_id)
            assert after is not None and after.fed == rec.fed < 20_000
            assert after.status == "cancelled"
            await _assert_retained(redis, job.job_id)
    finally:
        await redis.aclose()
        await mesh.close()


async def test_an_idle_feeder_only_looks_for_jobs(redis_url: str, model_repo: Path) -> None:
    """With no active job a round is one read: no lock taken, and `busy` tells `run` to
    come back only every IDLE_INTERVALS intervals; a job makes it busy again."""
    redis = aioredis.Redis.from_url(redis_url)
    await redis.delete(keys.BATCH_ACTIVE, keys.BATCH_FEED_LOCK)
    store = BatchStore(redis)
    repo = ModelRepository(model_repo)
    repo.load()
    feeder = Feeder(store, repo, {}, "router-a")
    assert await feeder.round() == 0
    assert not feeder.busy
    assert await redis.exists(keys.BATCH_FEED_LOCK) == 0
    await redis.sadd(keys.BATCH_ACTIVE, "no-such-job")
    assert await feeder.round() == 0
    assert feeder.busy
    assert await redis.get(keys.BATCH_FEED_LOCK) == b"router-a"
    await redis.delete(keys.BATCH_ACTIVE, keys.BATCH_FEED_LOCK)
    await redis.aclose()


async def _cli(*argv: str) -> tuple[int, str, str]:
    """`tiermesh ARGV...` as a user runs it (its own process: the CLI is synchronous)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tiermesh.cli.main",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_cli_tensor_job_results_as_npy_and_jsonl_match_online_answers(
    redis_url: str, model_repo: Path, tmp_path: Path
) -> None:
    """A JSONL file of tensors through `tiermesh batch submit --wait`: the progress bar
    and summary print, and the results (.npy and JSONL) equal the online answers."""
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(40, 1, 4)).astype(np.float32)
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text(
        "".join(
            json.dumps(
                {"inputs": {"INPUT0": {"datatype": "FP32", "shape": [1, 4], "data": x.tolist()}}}
            )
            + "\n"
            for x in xs
        )
    )
    mesh = await start_mesh(redis_url, model_repo)
    client = aioclient.InferenceServerClient(mesh.gateway)
    try:
        url = ["--url", mesh.gateway]
        code, out, err = await _cli("batch", "submit", "mlp", str(inputs), "--wait", *url)
        assert code == 0, err
        job_id, summary_line = out.strip().splitlines()
        summary = json.loads(summary_line)
        assert summary["job"] == job_id and summary["status"] == "done"
        assert (summary["inputs"], summary["errors"]) == (40, 0)
        assert summary["sequences_per_hour"] > 0
        assert "40/40" in err  # the progress bar reached the end
        npy = tmp_path / "out.npy"
        code, _, err = await _cli("batch", "results", job_id, "--out", str(npy), *url)
        assert code == 0, err
        got = np.load(npy)
        code, out, err = await _cli("batch", "results", job_id, *url)
        assert code == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert [line["index"] for line in lines] == list(range(40))
        assert np.allclose(np.array([line["outputs"]["OUTPUT0"][0] for line in lines]), got)
        online = []
        for x in xs:
            inp = aioclient.InferInput("INPUT0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            online.append((await client.infer("mlp", [inp])).as_numpy("OUTPUT0")[0])
        assert got.shape == (40, 3)
        assert np.allclose(got, np.stack(online), atol=1e-6)
        # A bad line is refused before anything is sent.
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"nothing": 1}\n')
        code, _, err = await _cli("batch", "submit", "mlp", str(bad), *url)
        assert code != 0 and "needs 'text' or 'inputs'" in err
    finally:
        await client.close()
        await mesh.close()
