"""Redis CPU per job of the admission script, by jobs per call (the front door's admit.go).

Starts a private redis-server as `make run` does (AOF, fsync every second), then queues the
same jobs (a 700-byte entry, the door's keys and bounds, one worker alive) with one script
call per job and with several jobs per call, round after round with the order alternating,
and reports redis-server's own CPU per job (from /proc) and the wall time per job, medians
over the rounds. The client's CPU is left out: the door's Go calls cost less than this
script's Python ones. It asserts nothing. All traffic goes to 127.0.0.1.

    .venv/bin/python benchmarks/admission_batch.py [--jobs 6400] [--per-call 1,8,32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from tiermesh.bench.cpu import process_cpu_s
from tiermesh.core.admission_script import ADMISSION_SCRIPT
from tiermesh.up.processes import free_port, stop
from tiermesh.up.redis_server import start_redis

ENTRY_BYTES = 700  # a 16-token job's entry, about
FAR_FUTURE_MS = 10**13  # the worker's heartbeat score: alive for the whole run


def one_call(store: redis.Redis, sha: str, first: int, jobs: int, entry: bytes) -> None:
    """One script call queueing `jobs` jobs (request ids from `first`), as admit.go builds it."""
    keys = ["tm:q:bench", "tm:workers:bench", "tm:rate:bench", "tm:guard:bench"]
    argv: list[object] = [jobs, "job", "traceparent", "tracestate"]
    for n in range(first, first + jobs):
        keys.append(f"tm:enqueued:{n}")
        argv += [1, 2, 3, len(keys), 10**6, 0, "16", 30_000, 35_000, entry, "", "", 4, 0]
    store.evalsha(sha, len(keys), *keys, *argv)


def measure(
    store: redis.Redis, pid: int, sha: str, per_call: int, jobs: int, ids: itertools.count[int]
) -> tuple[float, float]:
    """Redis CPU and wall time per job, in us, queueing `jobs` jobs `per_call` at a time."""
    entry = os.urandom(ENTRY_BYTES)
    calls = max(1, jobs // per_call)
    cpu0, t0 = process_cpu_s(pid), time.perf_counter()
    for _ in range(calls):
        one_call(store, sha, next(ids) * 1000, per_call, entry)
    wall, cpu = time.perf_counter() - t0, process_cpu_s(pid) - cpu0
    store.delete("tm:q:bench")
    done = calls * per_call
    return cpu / done * 1e6, wall / done * 1e6


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=6400, help="jobs per case and round")
    p.add_argument("--per-call", default="1,8,32", help="jobs per script call, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [int(x) for x in args.per_call.split(",")]
    with tempfile.TemporaryDirectory(prefix="tiermesh-admission-") as tmp:
        port = free_port()
        proc = start_redis(port, Path(tmp))
        store = redis.Redis(port=port)
        try:
            sha = store.script_load(ADMISSION_SCRIPT)
            store.zadd("tm:workers:bench", {"w": FAR_FUTURE_MS})
            ids = itertools.count()
            measure(store, proc.pid, sha, 8, 800, ids)  # warm up
            seen: dict[int, list[tuple[float, float]]] = {c: [] for c in cases}
            for r in range(args.rounds):
                for c in cases if r % 2 == 0 else reversed(cases):
                    seen[c].append(measure(store, proc.pid, sha, c, args.jobs, ids))
        finally:
            store.close()
            stop(proc, 5.0)
    print(
        f"admission_batch {time.strftime('%Y-%m-%d %H:%M')}: {args.jobs} jobs per case, "
        f"medians of {args.rounds} rounds; redis-server CPU and wall time per job"
    )
    for c in cases:
        cpu = statistics.median(x[0] for x in seen[c])
        wall = statistics.median(x[1] for x in seen[c])
        print(f"  {c:3d} jobs a call: redis CPU {cpu:6.1f} us/job, wall {wall:6.1f} us/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
