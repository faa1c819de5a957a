"""Online p99 at a steady online load alone, and beside a running batch job; and the job's
sequences per hour beside that load against the idle-machine limit (the same job alone).
Prints, asserts nothing. Runs a `tiermesh up` mesh (center tier only: one worker serves both
the online requests and the job, as the pacing is about) on a temporary repository holding
only the model: minilm-l6 by default (`make models`), short texts online (8-14 tokens) and
in the job; echo with `--model echo`.

Each round has three phases of --seconds: online alone, online beside a fresh job (order
alternating per round), and a fresh job alone (the idle limit). Every job is cancelled
after its phase (its queues freed at once). Figures are medians over the rounds; the
p99 ratio is the median of the per-round ratios, the job's share the median of the
per-round beside / alone rates.

    .venv/bin/python benchmarks/batch_beside_online.py [--model minilm-l6] [--rate 50]
        [--seconds 10] [--rounds 3] [--env TIERMESH_BATCH_TARGET_WAIT_MS=2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import yaml

from tiermesh.bench.calls import read_reply
from tiermesh.bench.records import STAGES
from tiermesh.bench.workload import counting_tokenizer, text_with_tokens
from tiermesh.core.model_config import parse_config
from tiermesh.core.model_files import mirror_model
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions
from tiermesh.v1 import batch_pb2, batch_pb2_grpc

REPO_ROOT = Path(__file__).resolve().parents[1]
P99_TARGET = 1.2
SHARE_TARGET = 0.5
CLIENT_THREADS = 8


@dataclass(frozen=True)
class Target:
    model: str
    input_name: str
    online_texts: list[bytes]  # cycled by the online load
    job_texts: list[str]  # one job's inputs


@dataclass(frozen=True)
class Online:
    p50_ms: float
    p99_ms: float
    stages_p99_ms: dict[str, float]  # the mesh's own stage times (queue_ms ...) at p99
    answered: int


@dataclass(frozen=True)
class Round:
    alone: Online
    beside: Online
    job_beside: float  # sequences/hour
    job_alone: float


def make_target(model: str, job: int, tokens: tuple[int, int]) -> Target:
    """Seeded texts: for a model with a tokenizer, `tokens` long as it counts them (online
    64 distinct ones, the job `job` drawn from 512); for echo, short plain strings."""
    folder = REPO_ROOT / "models" / model
    config = parse_config(yaml.safe_load((folder / "config.yaml").read_text()), str(folder))
    name = config.inputs[0].name
    if config.tokenize is None:
        online = [b"an online request"]
        return Target(model, name, online, [f"batch document {i}" for i in range(job)])
    tokenizer = counting_tokenizer(folder)
    rng = np.random.default_rng(23)

    def texts(n: int) -> list[str]:
        lo, hi = tokens
        return [
            text_with_tokens(tokenizer, rng, int(rng.integers(lo, hi + 1)))[0] for _ in range(n)
        ]

    online = [t.encode() for t in texts(64)]
    pool = texts(512)
    return Target(model, name, online, [pool[i % len(pool)] for i in range(job)])


def online_load(url: str, target: Target, rate: float, seconds: float) -> Online:
    """Open-loop requests at `rate`/s for `seconds` from CLIENT_THREADS threads (each call's
    latency counted from its due time when it went late)."""
    lat: list[float] = []
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    lock = threading.Lock()
    start = time.monotonic()

    def run(k: int) -> None:
        client = grpcclient.InferenceServerClient(url)
        i = k
        while (due := start + i / rate) < start + seconds:
            inp = grpcclient.InferInput(target.input_name, [1, 1], "BYTES")
            text = target.online_texts[i % len(target.online_texts)]
            inp.set_data_from_numpy(np.array([[text]], dtype=object))
            time.sleep(max(0.0, due - time.monotonic()))
            t = time.monotonic()
            result = client.infer(target.model, [inp])
            took = time.monotonic() - min(due, t)
            reply = read_reply(result.get_response().parameters)
            with lock:
                lat.append(took)
                for stage, values in stages.items():
                    values.append(reply.stages_ms.get(stage, 0.0))
            i += CLIENT_THREADS
        client.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in range(CLIENT_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Online(
        float(np.percentile(lat, 50) * 1000),
        float(np.percentile(lat, 99) * 1000),
        {stage: float(np.percentile(values, 99)) for stage, values in stages.items()},
        len(lat),
    )


def submit(stub: batch_pb2_grpc.BatchJobsStub, target: Target) -> str:
    texts = target.job_texts
    chunks = (
        batch_pb2.SubmitChunk(model=target.model, texts=texts[i : i + 5000])
        for i in range(0, len(texts), 5000)
    )
    reply: batch_pb2.BatchJob = stub.Submit(chunks)
    return reply.job_id


def done(stub: batch_pb2_grpc.BatchJobsStub, job_id: str) -> int:
    reply: batch_pb2.BatchJob = stub.Status(batch_pb2.JobRef(job_id=job_id))
    return int(reply.done)


def job_rate(stub: batch_pb2_grpc.BatchJobsStub, job_id: str, seconds: float) -> float:
    """Sequences per hour the job drains at over `seconds` (measured while it runs)."""
    a = done(stub, job_id)
    time.sleep(seconds)
    b = done(stub, job_id)
    return (b - a) / seconds * 3600


def started(stub: batch_pb2_grpc.BatchJobsStub, target: Target) -> str:
    """A fresh job, submitted and given a second to be running at its pace."""
    job = submit(stub, target)
    time.sleep(1)
    return job


def beside_job(
    url: str, stub: batch_pb2_grpc.BatchJobsStub, target: Target, args: argparse.Namespace
) -> tuple[Online, float]:
    """Online figures while a fresh job runs, and the job's drain rate meanwhile."""
    job = started(stub, target)
    result: dict[str, float] = {}
    rate_thread = threading.Thread(
        target=lambda: result.update(r=job_rate(stub, job, args.seconds))
    )
    rate_thread.start()
    online = online_load(url, target, args.rate, args.seconds)
    rate_thread.join()
    stub.Cancel(batch_pb2.JobRef(job_id=job))
    return online, result["r"]


def job_alone(stub: batch_pb2_grpc.BatchJobsStub, target: Target, seconds: float) -> float:
    """The idle-machine limit: a fresh job's drain rate with no online load."""
    job = started(stub, target)
    rate = job_rate(stub, job, seconds)
    stub.Cancel(batch_pb2.JobRef(job_id=job))
    return rate


def one_round(
    r: int, url: str, stub: batch_pb2_grpc.BatchJobsStub, target: Target, args: argparse.Namespace
) -> Round:
    if r % 2:
        beside, rate = beside_job(url, stub, target, args)
        alone = online_load(url, target, args.rate, args.seconds)
    else:
        alone = online_load(url, target, args.rate, args.seconds)
        beside, rate = beside_job(url, stub, target, args)
    return Round(alone, beside, rate, job_alone(stub, target, args.seconds))


def report(rows: Sequence[Round], args: argparse.Namespace, env: dict[str, str]) -> None:
    def med(values: Sequence[float]) -> float:
        return statistics.median(values)

    ratio = med([r.beside.p99_ms / r.alone.p99_ms for r in rows])
    share = med([r.job_beside / r.job_alone for r in rows])
    pool = ", batch pool" if args.batch_pool else ""
    print(
        f"{args.model}: {args.rate:.0f} online req/s (default priority), "
        f"{args.seconds:.0f} s per phase, {env}{pool}"
    )
    print(f"medians of {len(rows)} rounds (alone/beside alternating, then the job alone):")
    for name, pick in (("alone", lambda r: r.alone), ("beside a batch job", lambda r: r.beside)):
        print(
            f"online {name + ':':21s} p50 {med([pick(r).p50_ms for r in rows]):7.2f} ms, "
            f"p99 {med([pick(r).p99_ms for r in rows]):7.2f} ms"
        )
        stage_p99 = (
            f"{stage} {med([pick(r).stages_p99_ms[stage] for r in rows]):.2f}" for stage in STAGES
        )
        print(f"  stage p99s (ms): {', '.join(stage_p99)}")
    verdict = "met" if ratio <= P99_TARGET else "NOT met"
    print(f"  p99 beside/alone:           {ratio:8.2f}x  (target <= {P99_TARGET}x: {verdict})")
    print(f"batch job alone (idle limit): {med([r.job_alone for r in rows]):12,.0f} seq/h")
    print(f"batch job beside online:      {med([r.job_beside for r in rows]):12,.0f} seq/h")
    verdict = "met" if share >= SHARE_TARGET else "NOT met"
    print(f"  share of the idle limit:    {share:8.2%}  (target >= {SHARE_TARGET:.0%}: {verdict})")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="minilm-l6", help="minilm-l6 (texts) or echo")
    p.add_argument("--rate", type=float, default=50.0, help="online requests per second")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--job",
        type=int,
        default=20_000,
        help="inputs of each job: enough to outlast a phase, small enough that uploading it "
        "does not grow Redis's AOF into a rewrite mid-run",
    )
    p.add_argument("--tokens", default="8-14", help="token range of the texts (online and job)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--env", action="append", default=[], help="K=V for every mesh process")
    p.add_argument(
        "--batch-pool", action="store_true", help="tiermesh up --batch-pool (a niced batch worker)"
    )
    args = p.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    lo, hi = (int(x) for x in args.tokens.split("-"))
    target = make_target(args.model, args.job, (lo, hi))
    rows: list[Round] = []
    with tempfile.TemporaryDirectory() as tmp:
        opts = UpOptions(
            port=free_port(),
            data_dir=Path(tmp) / "data",
            model_repository=mirror_model(REPO_ROOT / "models" / args.model, Path(tmp) / "models"),
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
                online_load(url, target, args.rate, 2)  # warm up
                for r in range(args.rounds):
                    row = one_round(r, url, stub, target, args)
                    rows.append(row)
                    print(
                        f"round {r + 1}: p99 alone {row.alone.p99_ms:.2f} ms, beside "
                        f"{row.beside.p99_ms:.2f} ms "
                        f"({row.beside.p99_ms / row.alone.p99_ms:.2f}x); job beside "
                        f"{row.job_beside:,.0f} seq/h, alone {row.job_alone:,.0f} "
                        f"({row.job_beside / row.job_alone:.0%})",
                        flush=True,
                    )
        finally:
            mesh.stop()
    report(rows, args, env)


if __name__ == "__main__":
    main()
