"""Overload at 2x and 5x the capacity measured in the same run: open-loop Poisson arrivals
with per-request deadlines against `tiermesh up` on the mlp. The excess is refused with
RESOURCE_EXHAUSTED (and its retry-after-ms trailer), every call ends with a documented
code, no accepted request is lost, and the requests the mesh accepts are still answered.

The machine is small and shared, so every bound is a ratio to figures measured side by
side in this run (capacity, the latency at capacity), never an absolute throughput. The
load generator is a Python process on the same cores: where the cores are the limit it
takes CPU from the mesh as it offers more, and what its callers see measures it as much as
the mesh. So the goodput bound is the mesh's own: requests the gateway answered OK per CPU
second of every mesh process (from /proc), under overload against at capacity; the callers'
goodput is reported.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio

from tests.e2e.conftest import UpProcess, gateway_counts, report_figures, scrape_metrics
from tiermesh.bench import arrivals, runner
from tiermesh.bench.calls import Sender, model_inputs
from tiermesh.bench.cpu import process_cpu_s
from tiermesh.bench.records import OK, Record
from tiermesh.bench.stats import figures, lag_figures, percentile
from tiermesh.bench.workload import Workload

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "mlp"
DEADLINE_S = 1.0
# The gateway's own in-flight cap, the mesh's front-door queue bound. The default (4096)
# lets ~deadline x capacity requests queue inside the mesh: under overload they all wait
# until their deadline is nearly spent, and most of the work done is for callers that
# time out. 64 keeps the queue inside the mesh to ~64 / capacity (0.1-0.3 s here).
MAX_IN_FLIGHT = 64
# The router places mlp's jobs here, not the front door (TIERMESH_FRONT_DOOR_PLACES=0): the
# door queues a plain model's jobs itself for about a third of the CPU, and the capacity it
# reaches (~2,700/s on two cores) is more than this Python load generator can offer twice
# of on the same cores: the 2x and 5x phases then measure the generator's own backlog
# (seconds of send lag, the mesh at half a core) rather than the mesh. A generator that can
# offer it is issue #23's.
OVERLOAD_ENV = {"TIERMESH_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT), "TIERMESH_FRONT_DOOR_PLACES": "0"}
CAPACITY_CONCURRENCY = 32  # closed-loop callers when measuring capacity (< MAX_IN_FLIGHT)
WARMUP_S = 2.0
CAPACITY_S = 8.0
OVERLOAD_S = 10.0
RECOVERY_S = 4.0
# The mesh's goodput per CPU second under overload, as a fraction of its own at capacity:
# refusals cost the gateway little (~0.13 ms of mesh CPU against ~1.2 ms per answer here),
# so the CPU the mesh gets goes to the requests it serves. Measured on two cores, quiet:
# 0.93-1.16 at 2x, 0.55-0.77 at 5x (4 refusals per answer); beside a busy loop 1.38 / 0.98;
# beside a Go build and an apt install 0.76 / 0.34: at 5x the load generator, seconds
# behind, sends calls whose deadlines are nearly spent, and the gateway ends some of them
# DEADLINE_EXCEEDED or CANCELLED after the mesh worked on them. The floors hold those
# figures with room for a busy CI machine; at 5x it only says the mesh keeps serving.
# The callers' goodput is reported, not bound: where 32 callers, not the cores, limit
# capacity (1,280/s here) it was 0.98-1.16x at 2x, but 0.61x in CI (445/s, the cores the
# limit), and at 5x the load generator cannot send on time anywhere (send lag of seconds).
# On one core (taskset -c 0, 470/s) both fall to ~0.2 at 2x: the gateway's event loop takes
# calls off its gRPC server's queue late, so 2,200 of 5,100 end CANCELLED by their callers
# after the mesh worked on them; refusing before that queue is issue #23's.
GOODPUT_PER_CPU_FLOOR = {2.0: 0.6, 5.0: 0.2}
RECOVERED_FLOOR = 0.5
MULTIPLES = (2.0, 5.0)
ANSWER_SLACK = 1.1  # an answer's total_ms against the deadline: the gateway's loop turn
DOCUMENTED = {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED", "UNAVAILABLE"}


@dataclass(frozen=True)
class MeshReading:
    """Every mesh process's CPU seconds so far and the ModelInfer calls the gateway
    answered so far, by status code."""

    cpu_s: float
    answered: Counter[str]


class MeshMeter:
    """Reads the mesh of one `tiermesh up` between phases: its processes' CPU from /proc
    (the supervisor, the services and redis-server) and the calls answered by code from the
    Prometheus endpoints of the gateway and of its front door."""

    def __init__(self, up: UpProcess) -> None:
        self._pids = [up.proc.pid, *up.children().values()]
        # The Go front door counts the calls it answered itself; the gateway, the rest.
        urls = up.metrics_urls()
        self._metrics_urls = [urls[name] for name in ("frontdoor", "gateway") if name in urls]

    def read(self) -> MeshReading:
        cpu_s = sum(process_cpu_s(pid) for pid in self._pids)
        answered: Counter[str] = Counter()
        for url in self._metrics_urls:
            for (name, pairs), value in scrape_metrics(url).items():
                labels = dict(pairs)
                if name == "tiermesh_requests_total" and labels.get("model") == MODEL:
                    answered[labels["code"]] += int(value)
        return MeshReading(cpu_s, answered)


async def closed(
    send: Sender, workload: Workload, seconds: float, concurrency: int, meter: MeshMeter
) -> Phase:
    recorder = runner.Recorder()
    before = meter.read()
    start = time.perf_counter()
    await runner.closed_loop(
        send,
        workload,
        recorder,
        concurrency=concurrency,
        limit=1_000_000,
        until=start + seconds,
    )
    return Phase(recorder.records, time.perf_counter() - start, before, meter.read())


async def open_loop(
    send: Sender, workload: Workload, rate_rps: float, seed: int, meter: MeshMeter
) -> Phase:
    """Poisson arrivals at `rate_rps` for OVERLOAD_S; returns once every call ended."""
    recorder = runner.Recorder()
    times = arrivals.arrival_times(
        arrivals.BurstPlan(rate_rps=rate_rps),
        OVERLOAD_S,
        limit=1_000_000,
        rng=np.random.default_rng(seed),
    )
    before = meter.read()
    start = time.perf_counter()
    # No client-side cap: every arrival is sent whatever the mesh is doing.
    await runner.open_loop(send, workload, recorder, times, max_in_flight=1_000_000)
    return Phase(recorder.records, time.perf_counter() - start, before, meter.read())


class Phase:
    """The records of one phase, its figures and what the mesh spent and served in it."""

    def __init__(
        self, records: Sequence[Record], wall_s: float, before: MeshReading, after: MeshReading
    ) -> None:
        self.records = list(records)
        self.wall_s = wall_s
        self.figures = figures(self.records, wall_s)
        self.codes = Counter(r.outcome.code for r in self.records)
        self.mesh_cpu_s = after.cpu_s - before.cpu_s
        self.gateway_codes = after.answered - before.answered

    @property
    def served_per_cpu_s(self) -> float:
        """OK answers by the gateway per CPU second of the whole mesh."""
        served = self.gateway_codes[OK]
        return served / self.mesh_cpu_s if self.mesh_cpu_s > 0 else math.nan

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
            "send_lag_p99_ms": _ms(lag_figures(self.records)["p99_ms"]),
            "ok_gateway_p99_ms": _ms(percentile(self.gateway_totals(), 99)),
            "gateway_codes": dict(sorted(self.gateway_codes.items())),
            "mesh_cores": round(self.mesh_cpu_s / self.wall_s, 2),
            "mesh_served_per_cpu_s": round(self.served_per_cpu_s, 1),
        }


def multiple_of(phase: str) -> float:
    """The offered load of a phase in capacities (closed-loop phases count as 1)."""
    return float(phase[:-1]) if phase.endswith("x") else 1.0


def _ms(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 1)


async def drive(up: UpProcess) -> tuple[Phase, Phase, dict[float, Phase], Phase]:
    client = grpcaio.InferenceServerClient(up.url)
    meter = MeshMeter(up)
    try:
        workload = Workload(await model_inputs(client, MODEL), seed=8)
        send = Sender(client, MODEL, DEADLINE_S)
        warmup = await closed(send, workload, WARMUP_S, CAPACITY_CONCURRENCY, meter)
        capacity = await closed(send, workload, CAPACITY_S, CAPACITY_CONCURRENCY, meter)
        rate = capacity.figures.throughput_rps
        assert rate > 0, f"no request answered while measuring capacity: {capacity.codes}"
        overload = {}
        for seed, multiple in enumerate(MULTIPLES):
            overload[multiple] = await open_loop(send, workload, multiple * rate, seed, meter)
        recovered = await closed(send, workload, RECOVERY_S, CAPACITY_CONCURRENCY, meter)
        return warmup, capacity, overload, recovered
    finally:
        await client.close()


def test_overload_at_2x_and_5x_capacity(
    new_up: Callable[..., UpProcess],
    tmp_path: Path,
    record_property: Callable[[str, Any], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    up = new_up(extra_env=OVERLOAD_ENV, span_files=False)
    warmup, capacity, overload, recovered = asyncio.run(drive(up))
    assert up.interrupt() == 0
    gateway = gateway_counts(up)

    cap_rps = capacity.figures.throughput_rps
    phases = {
        "capacity": capacity,
        **{f"{m:g}x": p for m, p in overload.items()},
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
        "capacity_p99_ms": _ms(capacity.figures.p99_ms),
        "deadline_s": DEADLINE_S,
        "max_in_flight": MAX_IN_FLIGHT,
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
                f"| goodput {row['goodput_rps']}/s = {row['goodput_x_capacity']}x "
                f"| capacity {rows['capacity_rps']}/s | OK p50/p99 {row['ok_p50_ms']}/"
                f"{row['ok_p99_ms']} ms (gateway p99 {row['ok_gateway_p99_ms']} ms) "
                f"| refused p50/p99 {row['refused_p50_ms']}/"
                f"{row['refused_p99_ms']} ms | gateway {row['gateway_codes']} "
                f"| mesh {row['mesh_cores']} cores, "
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
    # The overload was real and the excess was refused, not queued.
    # The mesh keeps serving, and spends the CPU it gets on what it serves.
    for multiple, phase in overload.items():
        assert phase.codes.get("RESOURCE_EXHAUSTED", 0) > 0, (multiple, phase.codes)
        assert phase.figures.ok > 0, (multiple, phase.codes)
        kept = phase.served_per_cpu_s / capacity.served_per_cpu_s
        assert kept >= GOODPUT_PER_CPU_FLOOR[multiple], (multiple, kept, rows)
    # What the mesh accepted it answers within its deadline, by the gateway's own clock
    # (total_ms: received -> responded). The caller's latency is reported, not asserted: the
    # load generator's event loop, a Python process on the same two cores offering 2x or 5x
    # capacity, resumes a call long after its answer came (CI: an OK seen after 2.35 s by a
    # caller whose own gRPC deadline was 1.25 s, with a send lag p99 of 0.47 s). The answer
    # is stamped when the gateway's wait for it ends, a loop turn after the result came.
    for multiple, phase in overload.items():
        served = phase.gateway_totals()
        assert len(served) == phase.figures.ok, (multiple, "an OK without total_ms")
        late = sorted(ms for ms in served if ms > DEADLINE_S * 1000 * ANSWER_SLACK)
        assert not late, (multiple, late[-5:], rows)
    # Refusals come back sooner than the answers of the accepted requests they protect.
    refused_2x = overload[2.0].latencies("RESOURCE_EXHAUSTED")
    # No absolute bound (a timed assert): refusal latency here includes the load generator's
    # own event-loop time, a Python client offering 2x capacity on the same two cores (p50
    # 22-37 ms in earlier runs, 157 ms in CI once capacity reached 513/s). Issue #23 sets it.
    assert percentile(refused_2x, 50) <= overload[2.0].figures.p99_ms, rows
    # Once the flood stops the mesh serves near capacity again, refusing (almost) nothing.
    assert recovered.figures.throughput_rps >= RECOVERED_FLOOR * cap_rps, rows
    assert recovered.figures.ok >= 0.95 * recovered.figures.sent, recovered.codes
