"""The batcher-worker's own CPU, per batch and per row, without the rest of the mesh.

In this process: a private redis-server (as `make run` starts it), the real `Worker` loop
(two compute lanes, the real `StreamClient`) on the mlp model (its compute is a few us, so
what is measured is the loop around it), results handed to an in-process sink instead of
a gRPC hand-off. Per round and per --max-batch it queues --rows one-row jobs at once, then
steps the worker until every result is out and every entry acknowledged, and takes this
process's CPU (every thread) per row. Rounds alternate the order of the sizes; medians over
rounds. From the two largest sizes it fits CPU = per_batch / rows_per_batch + per_row, with
the rows per batch the worker actually formed. --profile prints cProfile's top functions of
one extra run (wall time, every coroutine of the loop's thread). It asserts nothing.

    .venv/bin/python benchmarks/worker_loop.py [--rows 3000] [--max-batch 8,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelRepository
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import encode_job
from tiermesh.up.processes import free_port, stop
from tiermesh.up.redis_server import start_redis
from tiermesh.worker.loop import Worker
from tiermesh.worker.runner import ModelRunner
from tiermesh.worker.streams import StreamClient

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL = "mlp"
UNIT = ComputeUnit(MODEL, "1", "fp32")
STREAM = StreamKey(UNIT, "center", 2, 0)
DEADLINE_S = 600


class Sink:
    """The hand-off: counts results and hand-offs (one a batch), sends nothing."""

    def __init__(self) -> None:
        self.results = 0
        self.handoffs = 0

    async def process(self, results: Sequence[JobResult]) -> None:
        self.results += len(results)
        self.handoffs += 1

    @property
    def unsent(self) -> int:
        return 0

    async def close(self) -> None:
        pass


def repository(root: Path, max_batch: int) -> ModelRepository:
    """mlp with `max_batch` as its max_batch_size."""
    dest = root / f"b{max_batch}" / MODEL
    shutil.copytree(REPO_ROOT / "models" / MODEL, dest)
    cfg = dest / "config.yaml"
    text = cfg.read_text()
    if "max_batch_size: 32" not in text:
        raise SystemExit(f"{cfg}: expected max_batch_size: 32")
    cfg.write_text(text.replace("max_batch_size: 32", f"max_batch_size: {max_batch}"))
    return ModelRepository(dest.parent)


async def queue_jobs(redis: aioredis.Redis, rows: int, tag: str) -> None:
    x = np.ones((1, 4), np.float32)
    now = time.time_ns()
    pipe = redis.pipeline(transaction=False)
    for i in range(rows):
        job = Job(
            request_id=f"{tag}-{i:08d}",
            model=MODEL,
            inputs=(from_numpy("INPUT0", x, "FP32"),),
            gateway="127.0.0.1:1",
            deadline_ns=now + DEADLINE_S * 10**9,
            priority=STREAM.priority,
            tier=STREAM.tier,
            timing=Timing(routed_ns=now, enqueued_ns=now),
        )
        pipe.xadd(STREAM.name, {keys.JOB_FIELD: encode_job(job)})
    await pipe.execute()


async def one_run(
    redis: aioredis.Redis, repo: ModelRepository, rows: int, tag: str, profile: bool = False
) -> tuple[float, float, str]:
    """(CPU us per row, rows per batch, the profile or "")."""
    cfg = repo.load()[MODEL]
    sink = Sink()
    worker = Worker(
        tier="center",
        configs={UNIT: cfg},
        runners={UNIT: ModelRunner(cfg, repo.checked_file(MODEL), intra_op_threads=1)},
        streams=StreamClient(redis, f"bench-{tag}"),
        handoff=sink,
        telemetry=Telemetry("worker-loop-bench"),
        poll_block_ms=50,
        lanes=2,
    )
    await worker.open()
    await queue_jobs(redis, rows, tag)
    profiler = cProfile.Profile() if profile else None
    cpu0 = time.process_time()
    if profiler is not None:
        profiler.enable()
    while sink.results < rows:
        await worker.step()
    await worker.drain()
    if profiler is not None:
        profiler.disable()
    cpu = time.process_time() - cpu0
    batches = sink.handoffs
    text = ""
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
        text = out.getvalue()
    return cpu / rows * 1e6, rows / max(batches, 1), text


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=3000, help="one-row jobs per run")
    p.add_argument("--max-batch", default="8,32", help="max_batch_size values, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="cProfile one run at the largest size")
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    sizes = sorted(int(x) for x in args.max_batch.split(","))
    with tempfile.TemporaryDirectory(prefix="tiermesh-worker-loop-") as tmp:
        port = free_port()
        proc = start_redis(port, Path(tmp) / "redis")
        redis = aioredis.Redis(port=port)
        try:
            repos = {b: repository(Path(tmp), b) for b in sizes}
            await one_run(redis, repos[sizes[-1]], 300, "warm")
            seen: dict[int, list[tuple[float, float]]] = {b: [] for b in sizes}
            for r in range(args.rounds):
                for b in sizes if r % 2 == 0 else reversed(sizes):
                    cpu, per_batch, _ = await one_run(redis, repos[b], args.rows, f"r{r}b{b}")
                    seen[b].append((cpu, per_batch))
            profile = ""
            if args.profile:
                profile = (await one_run(redis, repos[sizes[-1]], args.rows, "prof", True))[2]
        finally:
            await redis.aclose()
            stop(proc, 5.0)
    print(
        f"worker_loop {time.strftime('%Y-%m-%d %H:%M')}: {args.rows} one-row jobs a run, "
        f"medians of {args.rounds} rounds; this process's CPU (loop, lanes, mlp compute)"
    )
    med = {
        b: (statistics.median(c for c, _ in seen[b]), statistics.median(n for _, n in seen[b]))
        for b in sizes
    }
    for b in sizes:
        print(f"  max_batch {b:3d}: {med[b][0]:6.1f} us/row, {med[b][1]:5.1f} rows a batch")
    if len(sizes) >= 2:
        (c1, n1), (c2, n2) = med[sizes[-2]], med[sizes[-1]]
        if n1 != n2:
            per_batch = (c1 - c2) / (1 / n1 - 1 / n2)
            print(f"  fit: {per_batch:.0f} us a batch + {c2 - per_batch / n2:.0f} us a row")
    if profile:
        print(profile)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
