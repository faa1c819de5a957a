"""Overload at 2x and 5x the capacity measured in the same run, by crowds of closed-loop
callers that wait the retry-after they are told (2x and 5x the callers that measured the
capacity) and by open-loop Poisson arrivals (2x and 5x its rate), all with per-request
deadlines, against `tiermesh up` on MiniLM-L6 (or the mlp), its default
settings (the Go front door, the adaptive in-flight limits). The excess is refused at once
with RESOURCE_EXHAUSTED and its retry-after-ms trailer, every call ends with a documented
code, no accepted request is lost, the mesh keeps serving near its capacity, and the
requests it takes are answered, not left to expire in its queues.

The load comes from the compiled generator (tiermesh.bench.goload), pinned to half the
cores, the mesh to the other half: the generator stands for the clients' machines, so the
mesh's capacity and what it keeps of it under overload are its own. Every bound is a ratio
to figures measured side by side in this run (capacity, the latency at capacity), never an
absolute throughput.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc.aio as grpcaio

from tests.e2e.conftest import UpProcess, gateway_counts, report_figures, scrape_metrics
from tests.go_toolchain import needs_go
from tiermesh.bench.calls import model_inputs
from tiermesh.bench.cpu import process_cpu_s
from tiermesh.bench.goload import LoadConfig, LoadRequest, infer_request, run_load
from tiermesh.bench.records import OK, Record, Reply
from tiermesh.bench.stats import figures, lag_figures, percentile
from tiermesh.bench.workload import Workload
from tiermesh.core.cache_dir import default_cache_dir

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    needs_go,
]

# MiniLM-L6, the model issue #23's targets are set on (goodput >= 0.9x, refusal p99 <= 25 ms,
# accepted p99 <= 1.5x the 1x p99, <= 1% of the requests taken expiring in the queue);
# TIERMESH_OVERLOAD_MODEL=mlp runs it on the mlp, where a refusal's cost against a served
# call's is at its highest.
MODEL = os.environ.get("TIERMESH_OVERLOAD_MODEL", "minilm-l6")
DEADLINE_S = 1.0
OVERLOAD_ENV: dict[str, str] = {}  # the defaults `make run` has
CAPACITY_CONCURRENCY = 32  # closed-loop callers when measuring capacity
WARMUP_S = 2.0
CAPACITY_S = 8.0
# Issue #23 measures 20 s at each multiple; the suite 10 s (TIERMESH_OVERLOAD_S to change).
OVERLOAD_S = float(os.environ.get("TIERMESH_OVERLOAD_S", "10"))
RECOVERY_S = 4.0


@dataclass(frozen=True)
class Bounds:
    """What the test asserts at 2x and 5x, each bound with its noise margin."""

    goodput_floor: dict[float, float]  # served / capacity, by multiple
    refusal_p99_ms: float
    accepted_p99_x: float  # the accepted calls' p99 over the p99 at capacity
    max_expired_share: float  # of the requests taken
    # The share of the 32 callers' calls refused after the flood, where the capacity phase
    # refused at most that share too; None: not asserted (a model whose drain cap admits
    # fewer than 32: how many of its callers' calls are refused is how their retry-afters
    # fall, 1-70% after the flood in this session's runs, 0-4% at capacity).
    recovered_refused_share: float | None


# Measured here (mesh on one core, 10 s phases, the drain cap in the limits):
# - MiniLM-L6, its jobs placed by the front door on their tier (capacity 139-149/s, p99
#   352-384 ms; thirteen runs): goodput 0.85-0.96x at 2x, 0.80-0.93x at 5x (117-132/s
#   served); the crowds 0.90-0.96x (64 callers, three runs), 0.88-0.96x (160, eleven);
#   refusal p99 2.3-3.5 ms (crowds 3.8-14.0 ms); accepted p99 0.96-1.13x; none expired.
#   Through the router (capacity 119-137/s; twelve runs): 0.81-0.94x at 2x, 0.78-0.93x at
#   5x. Floors 0.7x (capacity moved 66-140/s between runs while another engineer's tests
#   ran); the targets for the refusal p99, the accepted p99 (1.5x: 0.93-1.13x in every run
#   since the drain cap, 1.2-1.9x before it) and the expiries.
# - mlp (capacity 2,000-3,100/s, p99 22-34 ms): goodput 0.85-1.27x at 2x, 0.42-1.12x at 5x
#   (a refusal costs ~40 us of the door's CPU against ~330 us for a served call: at 5x about
#   a fifth of the core goes to refusing); refusal p99 17-60 ms at 2x, 55-116 ms at 5x (on
#   one saturated core each process's wake-up is late, the door's refusals too); accepted
#   p99 2.4-6.8x the p99 at capacity; none expired. Floors 0.7x and 0.3x, bounds 250 ms and
#   10x (the fixed cap gave 0.65x and 0.13x, ~1 s refusals, 28-35x, 15,395-20,200 expired).
BOUNDS = {
    "minilm-l6": Bounds({2.0: 0.7, 5.0: 0.7}, 25.0, 1.5, 0.01, None),
    "mlp": Bounds({2.0: 0.7, 5.0: 0.3}, 250.0, 10.0, 0.01, 0.05),
}
# A DEADLINE_EXCEEDED this late (share of the deadline) expired in a queue; one sooner was
# refused up front for its deadline by admission (a refusal, as tests/e2e/test_priority_e2e.py
# counts them).
EXPIRED_AT = 0.9
RECOVERED_FLOOR = 0.5
# The exported drain rate against the capacity measured: at least, at most.
DRAIN_SPREAD = (0.3, 3.0)
MULTIPLES = (2.0, 5.0)
# Closed-loop callers at 2x and 5x the capacity phase's 32, each waiting the retry-after it
# is told (as gRPC's retry pushback does): crowds, which the limits' line of retry-afters
# spreads out (told the same few ms, 160 of them came back ~8,000 times a second: goodput
# 0.66x). Before the open-loop phases, which leave a class's limits low for a while.
CROWDS = (2, 5)
# A crowd's calls a second against the capacity, at most (160 callers: 2.0-2.1x).
CROWD_SENT_X = 4.0
ANSWER_SLACK = 1.1  # an answer's total_ms against the deadline: the gateway's loop turn
DOCUMENTED = {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}


@dataclass(frozen=True)
class MeshReading:
    """Every mesh process's CPU seconds so far and the ModelInfer calls the gateway
    answered so far, by status code."""

    cpu_s: float
    answered: Counter[str]
    cpu_by_process: dict[str, float]
    admissions: Counter[str]  # the router's admissions, by outcome


def model_counts(urls: Sequence[str], metric: str, label: str) -> Counter[str]:
    """The MODEL's samples of a counter summed over the endpoints, by one label's value."""
    counts: Counter[str] = Counter()
    for url in urls:
        for (name, pairs), value in scrape_metrics(url).items():
            labels = dict(pairs)
            if name == metric and labels.get("model") == MODEL:
                counts[labels[label]] += int(value)
    return counts


class MeshMeter:
    """Reads the mesh of one `tiermesh up` between phases: its processes' CPU from /proc
    (the supervisor, the services and redis-server), the calls answered by code from the
    Prometheus endpoints of the gateway and of its front door, and the router's admissions
    by outcome."""

    def __init__(self, up: UpProcess) -> None:
        self._pids = {"up": up.proc.pid, **up.children()}
        # The Go front door counts the calls it answered itself; the gateway, the rest.
        urls = up.metrics_urls()
        self._metrics_urls = [urls[name] for name in ("frontdoor", "gateway") if name in urls]
        self._router_urls = [urls["router"]] if "router" in urls else []

    def read(self) -> MeshReading:
        by_process = {name: process_cpu_s(pid) for name, pid in self._pids.items()}
        answered = model_counts(self._metrics_urls, "tiermesh_requests_total", "code")
        admissions = model_counts(self._router_urls, "tiermesh_admissions_total", "outcome")
        return MeshReading(sum(by_process.values()), answered, by_process, admissions)


async def closed(
    load: Load, seconds: float, concurrency: int, meter: MeshMeter, seed: int = 0
) -> Phase:
    """`concurrency` callers back to back; a refused one waits its retry-after, as a client
    with gRPC's retry pushback would (one sending again at once spins against a limit that
    refused it: on MiniLM 114,059 refusals in the 8 s at capacity, 583 served)."""
    config = load.config(
        seconds, mode="closed", concurrency=concurrency, seed=seed, honour_retry_after=True
    )
    return await _run(load, config, meter)


async def open_loop(load: Load, rate_rps: float, seed: int, meter: MeshMeter) -> Phase:
    """Poisson arrivals at `rate_rps` for OVERLOAD_S, every one sent on time whatever the
    mesh is doing (no client cap); returns once every call ended."""
    config = load.config(OVERLOAD_S, mode="open", rate_rps=rate_rps, seed=seed)
    return await _run(load, config, meter)


@dataclass(frozen=True)
class Load:
    """The compiled load generator's fixed part: where it sends, what, from which cache."""

    cache_dir: Path
    target: str
    requests: tuple[LoadRequest, ...]

    def config(self, seconds: float, **kw: Any) -> LoadConfig:
        # Enough connections that the mesh's 1,024 calls a connection never hold calls in
        # the client at 5x (deadline x rate outstanding at worst).
        return LoadConfig(
            self.target, self.requests, seconds, DEADLINE_S * 1000, connections=16, **kw
        )


async def _run(load: Load, config: LoadConfig, meter: MeshMeter) -> Phase:
    before = meter.read()
    run = await run_load(load.cache_dir, config)
    return Phase(run.records, run.wall_s, before, meter.read(), run.cpu_s)


class Phase:
    """The records of one phase, its figures and what the mesh spent and served in it."""

    def __init__(
        self,
        records: Sequence[Record],
        wall_s: float,
        before: MeshReading,
        after: MeshReading,
        load_cpu_s: float,
    ) -> None:
        self.records = list(records)
        self.load_cpu_s = load_cpu_s
        self.wall_s = wall_s
        self.figures = figures(self.records, wall_s)
        self.codes = Counter(r.outcome.code for r in self.records)
        self.mesh_cpu_s = after.cpu_s - before.cpu_s
        self.gateway_codes = after.answered - before.answered
        self.admissions = after.admissions - before.admissions
        self.cpu_by_process = {
            name: after.cpu_by_process[name] - before.cpu_by_process.get(name, 0.0)
            for name in after.cpu_by_process
        }

    @property
    def served_per_cpu_s(self) -> float:
        """OK answers by the gateway per CPU second of the whole mesh."""
        served = self.gateway_codes[OK]
        return served / self.mesh_cpu_s if self.mesh_cpu_s > 0 else math.nan

    def expired(self) -> int:
        """The calls that ended DEADLINE_EXCEEDED at their deadline: taken, then expired."""
        late = self.latencies("DEADLINE_EXCEEDED")
        return sum(1 for ms in late if ms >= EXPIRED_AT * DEADLINE_S * 1000)

    def latencies(self, code: str) -> list[float]:
        return [r.outcome.latency_ms for r in self.records if r.outcome.code == code]

    def gateway_totals(self) -> list[float]:
        """The OK answers' total_ms, received -> responded by the gateway's clock."""
        return [
            total
            for r in self.records
            if r.ok and r.outcome.reply is not None and (total := r.outcome.reply.total_ms)
        ]

    def row(self, capacity_rps: float, offered_rps: float) -> dict[str, Any]:
        f = self.figures
        expired = self.expired()
        refused = self.latencies("RESOURCE_EXHAUSTED")
        trailers = sum(
            1
            for r in self.records
            if r.outcome.code == "RESOURCE_EXHAUSTED" and r.outcome.retry_after_ms is not None
        )
        return {
            "offered_rps": round(offered_rps, 1),
            "sent": f.sent,
            "sent_rps": round(f.sent_rps, 1),
            "ok": f.ok,
            "refused": {k: v for k, v in sorted(self.codes.items()) if k != OK},
            "goodput_rps": round(f.throughput_rps, 1),
            "goodput_x_capacity": round(f.throughput_rps / capacity_rps, 2),
            "ok_p50_ms": _ms(f.p50_ms),
            "ok_p99_ms": _ms(f.p99_ms),
            "refused_p50_ms": _ms(percentile(refused, 50)),
            "refused_p99_ms": _ms(percentile(refused, 99)),
            "retry_after_trailers": trailers,
            "expired": expired,
            "refused_for_deadline": self.codes["DEADLINE_EXCEEDED"] - expired,
            "send_lag_p99_ms": _ms(lag_figures(self.records)["p99_ms"]),
            "ok_gateway_p99_ms": _ms(percentile(self.gateway_totals(), 99)),
            "gateway_codes": dict(sorted(self.gateway_codes.items())),
            "mesh_cores": round(self.mesh_cpu_s / self.wall_s, 2),
            "mesh_served_per_cpu_s": round(self.served_per_cpu_s, 1),
            "load_cores": round(self.load_cpu_s / self.wall_s, 2),
            "router_admissions": dict(sorted(self.admissions.items())),
            "cores_by_process": {
                name: round(cpu / self.wall_s, 3) for name, cpu in self.cpu_by_process.items()
            },
            **self.served_by_bucket(),
        }

    def served_by_bucket(self) -> dict[str, Any]:
        """The OK answers by length bucket: count, p99, mean batch size and the p99 of each
        stage (where an accepted request's time went)."""
        replies: dict[int, list[tuple[float, Reply]]] = {}
        for r in self.records:
            if r.ok and r.outcome.reply is not None:
                bucket = r.outcome.reply.bucket if r.outcome.reply.bucket is not None else -1
                replies.setdefault(bucket, []).append((r.outcome.latency_ms, r.outcome.reply))
        by_bucket = {}
        for bucket, rows in sorted(replies.items()):
            stages = sorted({s for _, reply in rows for s in reply.stages_ms})
            sizes = [reply.batch_size for _, reply in rows if reply.batch_size]
            by_bucket[str(bucket)] = {
                "ok": len(rows),
                "p99_ms": _ms(percentile([ms for ms, _ in rows], 99)),
                "mean_batch": round(sum(sizes) / len(sizes), 1) if sizes else None,
                "stage_p99_ms": {
                    s: _ms(percentile([x.stages_ms[s] for _, x in rows if s in x.stages_ms], 99))
                    for s in stages
                },
            }
        return {"by_bucket": by_bucket}


def multiple_of(phase: str) -> float:
    """The offered load of a phase in capacities (closed-loop phases count as 1)."""
    return float(phase[:-1]) if phase.endswith("x") else 1.0


def crowd_name(multiple: int) -> str:
    return f"{multiple}x callers"


def bound_multiple(phase: str) -> float:
    """The multiple whose bounds an overload phase is held to ("5x callers": 5x's)."""
    return float(phase.split("x", 1)[0])


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


async def drive(up: UpProcess) -> tuple[Phase, Phase, dict[str, Phase], Phase]:
    client = grpcaio.InferenceServerClient(up.url)
    try:
        workload = Workload(await model_inputs(client, MODEL), seed=8)
    finally:
        await client.close()
    requests = tuple(infer_request(MODEL, next(workload)) for _ in range(64))
    load = Load(default_cache_dir(), up.url, requests)
    meter = MeshMeter(up)
    warmup = await closed(load, WARMUP_S, CAPACITY_CONCURRENCY, meter)
    capacity = await closed(load, CAPACITY_S, CAPACITY_CONCURRENCY, meter, seed=1)
    rate = capacity.figures.throughput_rps
    assert rate > 0, f"no request answered while measuring capacity: {capacity.codes}"
    overload = {}
    for seed, crowd in enumerate(CROWDS, start=11):
        callers = crowd * CAPACITY_CONCURRENCY
        overload[crowd_name(crowd)] = await closed(load, OVERLOAD_S, callers, meter, seed=seed)
    for seed, multiple in enumerate(MULTIPLES, start=2):
        overload[f"{multiple:g}x"] = await open_loop(load, multiple * rate, seed, meter)
    recovered = await closed(load, RECOVERY_S, CAPACITY_CONCURRENCY, meter, seed=9)
    return warmup, capacity, overload, recovered


def split_cores(cores: set[int]) -> tuple[set[int], set[int]]:
    """Half the cores (rounded down, at least one) for the load generator, the rest for the
    mesh; one core: both share it."""
    ordered = sorted(cores)
    if len(ordered) < 2:
        return cores, cores
    load = max(1, len(ordered) // 2)
    return set(ordered[load:]), set(ordered[:load])


def test_overload_at_2x_and_5x_capacity(
    new_up: Callable[..., UpProcess],
    tmp_path: Path,
    record_property: Callable[[str, Any], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cores = os.sched_getaffinity(0)
    mesh_cores, load_cores = split_cores(cores)
    try:
        # The mesh on its cores, the load generator (and this process) on the others: the
        # generator stands for the clients' machines, and the mesh's capacity is its own.
        os.sched_setaffinity(0, mesh_cores)
        fetched = () if MODEL == "mlp" else (MODEL,)  # the mlp is built in; MiniLM fetched
        up = new_up(extra_env=OVERLOAD_ENV, span_files=False, fetched=fetched)
        os.sched_setaffinity(0, load_cores)
        warmup, capacity, overload, recovered = asyncio.run(drive(up))
        # The drain rate the limits learnt while they held the flood back, as exported.
        urls = [u for name, u in up.metrics_urls().items() if name in ("frontdoor", "gateway")]
        drain = model_counts(urls, "tiermesh_admission_drain_per_second", "priority")
        assert up.interrupt() == 0
    finally:
        os.sched_setaffinity(0, cores)
    gateway = gateway_counts(up)

    cap_rps = capacity.figures.throughput_rps
    phases = {
        "capacity": capacity,
        **overload,
        "after": recovered,
    }
    # The warm-up's calls count for the gateway's totals, not for the figures.
    every = [r for p in (warmup, *phases.values()) for r in p.records]
    codes = Counter(r.outcome.code for r in every)
    deadline_exceeded = codes.get("DEADLINE_EXCEEDED", 0)
    # Accepted (queued) requests whose result never reached the call: each must have ended
    # DEADLINE_EXCEEDED (or the caller saw that much); more than that would be lost.
    unanswered = gateway["accepted"] - gateway["answered"]
    phase_rows = {
        name: phase.row(cap_rps, cap_rps * multiple_of(name)) for name, phase in phases.items()
    }
    rows: dict[str, Any] = {
        "capacity_rps": round(cap_rps, 1),
        "drain_per_s": dict(drain),
        "capacity_p99_ms": _ms(capacity.figures.p99_ms),
        "deadline_s": DEADLINE_S,
        "gateway": gateway,
        "lost": max(0, unanswered - deadline_exceeded),
        "phases": phase_rows,
    }
    line = report_figures("overload", rows, tmp_path / "overload.json", record_property)
    with capsys.disabled():
        print(f"\n{line}")
        for name, row in phase_rows.items():
            print(
                f"| overload {name} | sent {row['sent']} | OK {row['ok']} | lost {rows['lost']} "
                f"| late/dup dropped {gateway['late_results']} | refused {row['refused']} "
                f"(expired {row['expired']}, for their deadline {row['refused_for_deadline']}) "
                f"| goodput {row['goodput_rps']}/s = {row['goodput_x_capacity']}x "
                f"| capacity {rows['capacity_rps']}/s | OK p50/p99 {row['ok_p50_ms']}/"
                f"{row['ok_p99_ms']} ms (gateway p99 {row['ok_gateway_p99_ms']} ms) "
                f"| refused p50/p99 {row['refused_p50_ms']}/"
                f"{row['refused_p99_ms']} ms | gateway {row['gateway_codes']} "
                f"| load generator {row['load_cores']} cores | mesh {row['mesh_cores']} cores, "
                f"{row['mesh_served_per_cpu_s']} OK per CPU s |"
            )

    # Every call ended with a documented code; nothing unexpected, nothing failed client-side.
    assert set(codes) <= DOCUMENTED, codes
    assert codes.get("INTERNAL", 0) == 0
    # Every refusal for lack of room says when to come back.
    refusals = [r for r in every if r.outcome.code == "RESOURCE_EXHAUSTED"]
    assert all(r.outcome.retry_after_ms is not None for r in refusals)
    # Exactly once: every OK the callers saw is a result the gateway handed to a waiting
    # call (a few more may have been handed over as the caller's own deadline cut the call:
    # those callers saw DEADLINE_EXCEEDED), and no accepted request vanished without at
    # least a DEADLINE_EXCEEDED.
    assert codes[OK] <= gateway["answered"] <= codes[OK] + deadline_exceeded, (gateway, codes)
    assert unanswered <= deadline_exceeded, (gateway, codes)
    # The overload was real and the excess was refused at once, not queued: the mesh keeps
    # serving near its capacity, its answers near its latency at capacity, and what it
    # takes it answers rather than letting it expire in a queue.
    cap_p99 = capacity.figures.p99_ms
    bounds = BOUNDS[MODEL]
    for name, phase in overload.items():
        multiple = bound_multiple(name)
        refused = phase.latencies("RESOURCE_EXHAUSTED")
        # (A crowd overloads a slow model only: 160 callers of the mlp are served 1.2x the
        # capacity 32 of them measured, their round trips being most of their time.)
        assert refused or name.endswith("callers"), (name, phase.codes)
        goodput = phase.figures.throughput_rps / cap_rps
        assert goodput >= bounds.goodput_floor[multiple], (name, goodput, rows)
        assert not refused or percentile(refused, 99) <= bounds.refusal_p99_ms, (name, rows)
        assert phase.figures.p99_ms <= bounds.accepted_p99_x * cap_p99, (name, rows)
        expired = phase.expired()
        taken = phase.figures.ok + expired
        assert expired <= bounds.max_expired_share * taken, (name, expired, taken, rows)
    # The limits' drain rate (which the drain cap reads) is the mesh's capacity as this run
    # measured it, within the noise of the phases (MiniLM: 105-130/s against 119-135/s).
    assert DRAIN_SPREAD[0] * cap_rps <= sum(drain.values()) <= DRAIN_SPREAD[1] * cap_rps, (
        drain,
        cap_rps,
    )
    # What the mesh accepted it answers within its deadline, by the gateway's own clock
    # (total_ms: received -> responded), stamped when the gateway's wait for it ends.
    for name, phase in overload.items():
        served = phase.gateway_totals()
        assert len(served) == phase.figures.ok, (name, "an OK without total_ms")
        late = sorted(ms for ms in served if ms > DEADLINE_S * 1000 * ANSWER_SLACK)
        assert not late, (name, late[-5:], rows)
    # Refusals come back sooner than the answers of the accepted requests they protect.
    refused_2x = overload["2x"].latencies("RESOURCE_EXHAUSTED")
    assert percentile(refused_2x, 50) <= overload["2x"].figures.p99_ms, rows
    # A crowd waits its line: it calls at about the rate the mesh drains, not at the rate
    # of its refusals (~8,000 a second with one short retry-after for all).
    for crowd in CROWDS:
        sent = overload[crowd_name(crowd)].figures.sent_rps
        assert sent <= CROWD_SENT_X * cap_rps, (crowd, sent, rows)
    # Once the flood stops the mesh serves near capacity again; where the limits let the 32
    # callers in at capacity (the mlp), they do after the flood too. (MiniLM's drain cap
    # admits ~30 of them: Bounds.recovered_refused_share.)
    assert recovered.figures.throughput_rps >= RECOVERED_FLOOR * cap_rps, rows
    share = bounds.recovered_refused_share
    refused_share = {p: 1 - p.figures.ok / p.figures.sent for p in (capacity, recovered)}
    if share is not None and refused_share[capacity] <= share:
        assert refused_share[recovered] <= share, recovered.codes
