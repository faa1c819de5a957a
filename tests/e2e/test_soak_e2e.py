"""Soak: minutes of open-loop Poisson load at ~70% of the capacity measured in the same run
against `tiermesh up` on the mlp, sampling every few seconds the RSS and open fds of each
child process and Redis' memory for data (used_memory_dataset). After a warm-up, none of
them may grow; once the load stops, Redis gives its memory back (streams are XDEL'd after
the hand-off, per-request keys expire). Nothing accepted is lost, nothing is INTERNAL.

TIERMESH_SOAK_S sets the length of the loaded part (default 100 s, so CI stays short).
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
import tritonclient.grpc.aio as grpcaio

from tests.e2e.conftest import UpProcess, gateway_counts, report_figures, single_redis
from tiermesh.bench import arrivals, runner
from tiermesh.bench.calls import Sender, model_inputs
from tiermesh.bench.records import OK, Record
from tiermesh.bench.stats import figures
from tiermesh.bench.workload import Workload
from tiermesh.core.redis_client import MAX_CONNECTIONS

SOAK_S = float(os.environ.get("TIERMESH_SOAK_S", "100"))
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(SOAK_S + 240)]

MODEL = "mlp"
LOAD_SHARE = 0.7  # of the capacity measured just before
DEADLINE_S = 5.0
CAPACITY_CONCURRENCY = 32
WARMUP_S = 2.0
CAPACITY_S = 8.0
SAMPLE_EVERY_S = 3.0
MB = 1024 * 1024
# Flatness, comparing the mean of the last third of the samples with the second third (the
# first third is warm-up: allocator arenas, caches and connection pools fill). RSS may grow
# by at most 10% and 30 MB, with a floor of 5 MB for small processes, where allocator noise
# alone moves that much (redis-server is ~10 MB).
RSS_GROWTH_RATIO = 0.10
RSS_GROWTH_MAX = 30 * MB
RSS_GROWTH_FLOOR = 5 * MB
FD_GROWTH_MAX = 4
# Redis under steady load holds the streams' backlog and per-request keys for their
# deadline plus a margin: flat within this much.
REDIS_GROWTH_MAX = 2 * MB
# After the load, Redis is back near where it was before any request within this long:
# per-request keys live until their deadline plus a 5 s margin (admission's idempotency).
REDIS_SETTLE_S = DEADLINE_S + 5 + 20
REDIS_SETTLED_MAX = MB // 2
DOCUMENTED = {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}


@dataclass
class Samples:
    """One row every SAMPLE_EVERY_S: per child process RSS, its Redis connections and its
    other fds, and Redis' memory.

    Redis connections are counted apart: a service's connection pool grows to the highest
    concurrency it has met and keeps its connections (bounded by the pool size), so a burst
    late in the soak adds some for good; a leak grows with the request count instead. The
    other fds (files, pipes, gRPC sockets) must stay flat."""

    pids: dict[str, int]
    redis_port: int
    t_s: list[float] = field(default_factory=list)
    rss: dict[str, list[int]] = field(default_factory=dict)
    fds: dict[str, list[int]] = field(default_factory=dict)
    redis_conns: dict[str, list[int]] = field(default_factory=dict)
    redis_used: list[int] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)

    async def take(self, client: aioredis.Redis, t_s: float) -> None:
        self.t_s.append(t_s)
        to_redis = redis_socket_inodes(self.redis_port)
        for name, pid in self.pids.items():
            try:
                rss = vm_rss(pid)
                links = [
                    os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
                ]
            except (OSError, ValueError):
                self.gone.add(name)  # died (or restarted under another pid)
                rss, links = -1, []
            conns = sum(1 for link in links if socket_inode(link) in to_redis)
            self.rss.setdefault(name, []).append(rss)
            self.fds.setdefault(name, []).append(len(links) - conns if rss >= 0 else -1)
            self.redis_conns.setdefault(name, []).append(conns)
        self.redis_used.append(await redis_used_memory(client))


def socket_inode(link: str) -> int | None:
    """The inode of an fd's `socket:[inode]` link, None for anything else."""
    if link.startswith("socket:[") and link.endswith("]"):
        return int(link[8:-1])
    return None


def redis_socket_inodes(port: int) -> set[int]:
    """Inodes of the TCP sockets with `port` at either end (to and in redis-server)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, remote, inode = cols[1], cols[2], int(cols[9])
            if (
                int(local.rsplit(":", 1)[1], 16) == port
                or int(remote.rsplit(":", 1)[1], 16) == port
            ):
                found.add(inode)
    return found


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for {pid}")


async def redis_used_memory(client: aioredis.Redis) -> int:
    """What Redis' data takes (used_memory less its overhead: client buffers, the AOF
    buffer), so the number of connected clients does not count as growth."""
    return int((await client.info("memory"))["used_memory_dataset"])


def thirds(values: list[int]) -> tuple[list[int], list[int]]:
    third = len(values) // 3
    return values[third : 2 * third], values[2 * third :]


def growth(values: list[int]) -> tuple[float, float]:
    """Mean of the last third minus mean of the second third, and the second third's mean."""
    second, last = thirds(values)
    base = float(np.mean(second))
    return float(np.mean(last)) - base, base


def slope_per_min(t_s: list[float], values: list[int]) -> float:
    """Least-squares slope over the samples after the warm-up third, per minute."""
    third = len(values) // 3
    xs, ys = np.asarray(t_s[third:]), np.asarray(values[third:], dtype=float)
    return float(np.polyfit(xs, ys, 1)[0] * 60) if len(xs) >= 2 else math.nan


def rss_allowed(base: float) -> float:
    return max(RSS_GROWTH_FLOOR, min(RSS_GROWTH_RATIO * base, RSS_GROWTH_MAX))


@dataclass
class Soak:
    capacity_rps: float
    before: list[Record]  # warm-up and capacity measurement
    records: list[Record]  # the soak itself
    wall_s: float
    samples: Samples
    redis_before: int
    redis_after: int
    redis_settled_s: float


async def closed(send: Sender, workload: Workload, seconds: float) -> list[Record]:
    recorder = runner.RunRecorder()
    start = time.perf_counter()
    await runner.closed_loop(
        send,
        workload,
        recorder,
        concurrency=CAPACITY_CONCURRENCY,
        limit=1_000_000,
        until=start + seconds,
    )
    return recorder.records


async def sampler(samples: Samples, client: aioredis.Redis, stop: asyncio.Event) -> None:
    start = time.perf_counter()
    while not stop.is_set():
        await samples.take(client, time.perf_counter() - start)
        try:
            await asyncio.wait_for(stop.wait(), SAMPLE_EVERY_S)
        except TimeoutError:
            pass


async def drive(up: UpProcess) -> Soak:
    pids = {name: pid for name, pid in up.children().items()}
    redis_url = up.redis_url()
    redis = aioredis.Redis.from_url(redis_url)
    client = grpcaio.InferenceServerClient(up.url)
    try:
        redis_before = await redis_used_memory(redis)
        workload = Workload(await model_inputs(client, MODEL), seed=9)
        send = Sender(client, MODEL, DEADLINE_S)
        warm = await closed(send, workload, WARMUP_S)
        start = time.perf_counter()
        measured = await closed(send, workload, CAPACITY_S)
        capacity = figures(measured, time.perf_counter() - start).throughput_rps
        assert capacity > 0, Counter(r.outcome.code for r in measured)

        samples = Samples(pids, int(redis_url.rsplit(":", 1)[1].split("/")[0]))
        stop = asyncio.Event()
        sampling = asyncio.create_task(sampler(samples, redis, stop))
        recorder = runner.RunRecorder()
        times = arrivals.arrival_times(
            arrivals.BurstPlan(rate_rps=LOAD_SHARE * capacity),
            SOAK_S,
            limit=10_000_000,
            rng=np.random.default_rng(9),
        )
        start = time.perf_counter()
        try:
            await runner.open_loop(send, workload, recorder, times, max_in_flight=1_000_000)
        finally:
            stop.set()
            await sampling
        wall_s = time.perf_counter() - start

        # Load stopped: Redis should give back what the load took (polled, bounded).
        settle_start = time.monotonic()
        while (after := await redis_used_memory(redis)) > redis_before + REDIS_SETTLED_MAX:
            if time.monotonic() - settle_start > REDIS_SETTLE_S:
                break
            await asyncio.sleep(0.5)
        settled_s = time.monotonic() - settle_start
        return Soak(
            capacity,
            warm + measured,
            recorder.records,
            wall_s,
            samples,
            redis_before,
            after,
            settled_s,
        )
    finally:
        await client.close()
        await redis.aclose()


@single_redis
def test_soak_at_70_percent_of_capacity_stays_flat(
    new_up: Callable[..., UpProcess],
    tmp_path: Path,
    record_property: Callable[[str, Any], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    up = new_up(span_files=False)
    soak = asyncio.run(drive(up))
    assert up.interrupt() == 0
    gateway = gateway_counts(up)

    f = figures(soak.records, soak.wall_s)
    codes = Counter(r.outcome.code for r in soak.before + soak.records)
    samples = soak.samples
    per_process: dict[str, dict[str, float]] = {}
    for name in samples.pids:
        rss_growth, rss_base = growth(samples.rss[name])
        second_fds, last_fds = thirds(samples.fds[name])
        per_process[name] = {
            "rss_mb": round(rss_base / MB, 1),
            "rss_growth_mb": round(rss_growth / MB, 2),
            "rss_allowed_mb": round(rss_allowed(rss_base) / MB, 1),
            "rss_slope_mb_per_min": round(slope_per_min(samples.t_s, samples.rss[name]) / MB, 2),
            "fds": max(second_fds),
            "fds_growth": max(last_fds) - max(second_fds),
            "redis_connections": max(samples.redis_conns[name]),
        }
    redis_growth, redis_base = growth(samples.redis_used)
    row: dict[str, Any] = {
        "duration_s": round(soak.wall_s, 1),
        "capacity_rps": round(soak.capacity_rps, 1),
        "offered_rps": round(LOAD_SHARE * soak.capacity_rps, 1),
        "sent": f.sent,
        "ok": f.ok,
        "lost": gateway["accepted"] - gateway["answered"],
        "late_or_duplicate_results_dropped": gateway["late_results"],
        "refused": {
            k: n
            for k, n in sorted(Counter(r.outcome.code for r in soak.records).items())
            if k != OK
        },
        "goodput_rps": round(f.throughput_rps, 1),
        "p50_ms": round(f.p50_ms, 1),
        "p99_ms": round(f.p99_ms, 1),
        "samples": len(samples.t_s),
        "processes": per_process,
        "redis_dataset_mb": {
            "before": round(soak.redis_before / MB, 2),
            "loaded": round(redis_base / MB, 2),
            "growth": round(redis_growth / MB, 2),
            "peak": round(max(samples.redis_used) / MB, 2),
            "after": round(soak.redis_after / MB, 2),
            "settled_in_s": round(soak.redis_settled_s, 1),
        },
        "gateway": gateway,
    }
    line = report_figures("soak", row, tmp_path / "soak.json", record_property)
    with capsys.disabled():
        print(f"\n{line}")
        print(
            f"| soak {row['duration_s']} s at {LOAD_SHARE:.0%} | sent {row['sent']} "
            f"| OK {row['ok']} | lost {row['lost']} | late/dup dropped "
            f"{row['late_or_duplicate_results_dropped']} | refused {row['refused']} "
            f"| goodput {row['goodput_rps']}/s | capacity {row['capacity_rps']}/s "
            f"| p50/p99 {row['p50_ms']}/{row['p99_ms']} ms | redis MB {row['redis_dataset_mb']} |"
        )
        for name, proc in per_process.items():
            print(f"|   soak {name} | {proc} |")

    assert len(samples.t_s) >= 9, "too few samples to judge flatness"
    assert not samples.gone, f"processes died or restarted during the soak: {samples.gone}"
    # Nothing lost, nothing unexpected.
    assert set(codes) <= DOCUMENTED, codes
    assert codes.get("INTERNAL", 0) == 0
    assert gateway["accepted"] == gateway["answered"] == codes[OK], (gateway, codes)
    # Below capacity, (nearly) everything is answered.
    assert f.ok >= 0.95 * f.sent, row
    # Flat: no process grows, no fd leaks, Redis holds steady and gives memory back.
    for name, p in per_process.items():
        assert p["rss_growth_mb"] <= p["rss_allowed_mb"], (name, p)
        assert p["fds_growth"] <= FD_GROWTH_MAX, (name, p)
        assert p["redis_connections"] <= MAX_CONNECTIONS + 1, (name, p)  # + a pubsub/monitor
    assert redis_growth <= REDIS_GROWTH_MAX, row["redis_dataset_mb"]
    assert soak.redis_after <= soak.redis_before + REDIS_SETTLED_MAX, row["redis_dataset_mb"]
