"""Online p99 at a steady online load alone, and beside a running batch job; and the job's
sequences per hour against the idle-machine limit for the same model. Prints, asserts
nothing. Runs a `tiermesh up` mesh (center tier) on the project's echo model (`make models`).

    .venv/bin/python benchmarks/batch_beside_online.py [--rate 100] [--seconds 10]
        [--rounds 3] [--env TIERMESH_BATCH_BACKGROUND_DUTY=0.5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient

from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]


def online_p99(url: str, rate: float, seconds: float) -> tuple[float, int]:
    """Open-loop requests at `rate`/s for `seconds` from 8 threads; (p99 ms, answered)."""
    lat: list[float] = []
    lock = threading.Lock()
    start = time.monotonic()

    def run(k: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
        inp.set_data_from_numpy(np.array([[b"an online request"]], dtype=object))
        i = k
        while (due := start + i / rate) < start + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            t = time.monotonic()
            client.infer("echo", [inp], priority=1)
            with lock:
                lat.append(time.monotonic() - due if due > t else time.monotonic() - t)
            i += 8

    threads = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return float(np.percentile(lat, 99) * 1000), len(lat)


def submit(stub: batch_pb2_grpc.BatchJobsStub, n: int) -> str:
    texts = [f"batch document {i}" for i in range(n)]
    chunks = (
        batch_pb2.SubmitChunk(model="echo", texts=texts[i : i + 5000]) for i in range(0, n, 5000)
    )
    reply: batch_pb2.BatchJob = stub.Submit(chunks)
    return reply.job_id


def finished(stub: batch_pb2_grpc.BatchJobsStub, job_id: str) -> batch_pb2.BatchJob:
    reply: batch_pb2.BatchJob = stub.Status(batch_pb2.JobRef(job_id=job_id))
    return reply


def job_rate(stub: batch_pb2_grpc.BatchJobsStub, job_id: str, seconds: float) -> float:
    """Sequences per hour the job drains at over `seconds` (measured while it runs)."""
    a = finished(stub, job_id).done
    time.sleep(seconds)
    b = finished(stub, job_id).done
    return (b - a) / seconds * 3600


def beside_job(
    url: str, stub: batch_pb2_grpc.BatchJobsStub, args: argparse.Namespace
) -> tuple[float, int, float]:
    """Online p99 while a fresh job runs, and the job's drain rate meanwhile; the job is
    cancelled after (its queues freed at once)."""
    job = submit(stub, args.job)
    time.sleep(1)  # the job is running
    result: dict[str, float] = {}
    rate_thread = threading.Thread(
        target=lambda: result.update(r=job_rate(stub, job, args.seconds))
    )
    rate_thread.start()
    p99, n = online_p99(url, args.rate, args.seconds)
    rate_thread.join()
    stub.Cancel(batch_pb2.JobRef(job_id=job))
    return p99, n, result["r"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=100.0, help="online requests per second")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--job",
        type=int,
        default=30_000,
        help="inputs of each job beside online load (the idle-limit job has twice as many); "
        "enough to outlast a phase, small enough that uploading it does not grow Redis's "
        "AOF into a rewrite mid-run",
    )
    p.add_argument("--rounds", type=int, default=3, help="alone/beside pairs, order alternating")
    p.add_argument("--env", action="append", default=[], help="K=V for every mesh process")
    p.add_argument(
        "--batch-pool", action="store_true", help="tiermesh up --batch-pool (a niced batch worker)"
    )
    args = p.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    rows: list[tuple[float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        opts = UpOptions(
            port=free_port(),
            data_dir=Path(tmp) / "data",
            model_repository=REPO_ROOT / "models",
            metrics_port=0,
            http_port=-1,
            tiers=("center",),
            batch_pool=args.batch_pool,
            extra_env={"TIERMESH_LOG_LEVEL": "warning", **env},
        )
        mesh = Mesh(opts)
        url = f"127.0.0.1:{opts.port}"
        try:
            mesh.start()
            with grpc.insecure_channel(url) as channel:
                stub = batch_pb2_grpc.BatchJobsStub(channel)
                online_p99(url, args.rate, 2)  # warm up
                # The idle-machine limit: a job alone (no online load).
                idle_job = submit(stub, 2 * args.job)
                idle = job_rate(stub, idle_job, args.seconds)
                stub.Cancel(batch_pb2.JobRef(job_id=idle_job))
                for r in range(args.rounds):
                    if r % 2:
                        beside, _, rate = beside_job(url, stub, args)
                        alone, _ = online_p99(url, args.rate, args.seconds)
                    else:
                        alone, _ = online_p99(url, args.rate, args.seconds)
                        beside, _, rate = beside_job(url, stub, args)
                    rows.append((alone, beside, rate))
                    print(
                        f"round {r + 1}: p99 alone {alone:.2f} ms, beside {beside:.2f} ms "
                        f"({beside / alone:.2f}x); job {rate:,.0f} seq/h",
                        flush=True,
                    )
        finally:
            mesh.stop()
    alone_m = statistics.median(a for a, _, _ in rows)
    beside_m = statistics.median(b for _, b, _ in rows)
    ratio_m = statistics.median(b / a for a, b, _ in rows)
    rate_m = statistics.median(r for _, _, r in rows)
    pool = ", batch pool" if args.batch_pool else ""
    print(
        f"online load: {args.rate:.0f} req/s of echo, {args.seconds:.0f} s per phase, {env}{pool}"
    )
    print(f"medians of {len(rows)} rounds (phases alternating alone/beside):")
    print(f"online p99 alone:              {alone_m:8.2f} ms")
    print(f"online p99 beside a batch job: {beside_m:8.2f} ms")
    print(f"  ratio beside/alone:          {ratio_m:8.2f}x  (median per round; target <= 1.2x)")
    print(f"batch job alone (idle limit):  {idle:12,.0f} sequences/hour")
    print(f"batch job beside online load:  {rate_m:12,.0f} sequences/hour")
    print(f"  share of the idle limit:     {rate_m / idle:8.2%}")


if __name__ == "__main__":
    main()
