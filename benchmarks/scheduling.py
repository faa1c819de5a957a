"""Length-bucketed batching against one FIFO bucket, and priority under a flood.

Builds two temporary model repositories holding one text model (default minilm-l3):
"bucketed", the committed config, and "fifo", the same config with `length_buckets`
removed (one bucket: max_batch_size 32, the wait of the 16-token bucket). Both link the
same weights. Starts a private mesh on each (own redis-server, own data dir), then:

1. Mixed workload at saturation, in --repeats rounds, the two meshes measured one after
   the other (never at once; odd rounds swap the order): seeded texts, 70% short
   (8-14 tokens), 25% medium (40-60), 5% long (110-128; 200-250 for a model whose
   tokenizer takes 256), one text per request, --concurrency callers in a closed loop.
   Throughput, p50/p99 latency, padding waste (sum of padded tokens / sum of tokens, from
   the response parameters) and the mean batch size; the ratio bucketed / FIFO throughput
   per round, then the median.
2. Priority on the bucketed mesh, its capacity taken from step 1: a priority-1 trickle of
   short texts at a fixed inter-arrival (5% of capacity), alone and then beside a
   priority-2 flood of the mixed texts offered open loop at 2x capacity (by the compiled
   load generator, tiermesh.bench.goload, which takes ~0.05 of a core where a Python
   client took ~0.3 of the two; `--flood-client python`: a separate Python process, so the
   trickle's clock is not delayed by the flood's client; each flood request
   has a 2 s timeout, and refusals are expected and counted). p99 of the trickle loaded /
   unloaded per round, then the median; where its latency goes (queue vs compute).

Prints a table; asserts nothing. All traffic goes to 127.0.0.1 and is bounded in count and
time. Progress and the children's output go to stderr.

    .venv/bin/python benchmarks/scheduling.py [--model minilm-l3] [--requests N]
        [--concurrency C] [--repeats R] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
import yaml
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from tiermesh.bench.calls import values_of
from tiermesh.bench.cpu import process_cpu_s
from tiermesh.bench.goload import LoadConfig, LoadUnavailable, infer_request, run_load
from tiermesh.bench.goload import binary as goload_binary
from tiermesh.bench.workload import (
    RequestSpec,
    TokenText,
    WorkloadTensor,
    counting_tokenizer,
    mixed_texts,
)
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.core.model_config import parse_config
from tiermesh.core.model_files import mirror_model
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
MIX = (("short", 0.70), ("medium", 0.25), ("long", 0.05))
SHORT_TOKENS = (8, 14)
MEDIUM_TOKENS = (40, 60)
TARGETS = {"throughput_ratio_min": 1.3, "priority_p99_ratio_max": 2.0}  # issue 23: 2.0
INT_PARAMS = (
    "tokens",
    "padded_tokens",
    "batch_size",
    "bucket",
    "preprocess_us",
    "queue_us",
    "batch_wait_us",
    "compute_us",
    "postprocess_us",
    "delivery_us",
)
STAGES = (
    "preprocess_us",
    "queue_us",
    "batch_wait_us",
    "compute_us",
    "postprocess_us",
    "delivery_us",
)
OUTSIDE = "outside_us"  # client latency minus the stages: client <-> gateway, tritonclient
REQUEST_TIMEOUT_S = 10.0  # closed loop and trickle requests
SETTLE_S = 1.0  # after a flood, before the next measurement
MESSAGE_CHARS = 90
MESSAGE_LINES = 4  # refusal messages shown in the table (all in --json)


def make_texts(
    tok: Tokenizer,
    rng: np.random.Generator,
    n: int,
    long_tokens: tuple[int, int],
    kinds: Sequence[tuple[str, float]] = MIX,
) -> list[TokenText]:
    """`n` texts in the exact proportions of `kinds` (rounded), shuffled."""
    ranges = {"short": SHORT_TOKENS, "medium": MEDIUM_TOKENS, "long": long_tokens}
    return mixed_texts(tok, rng, n, [(k, share, ranges[k]) for k, share in kinds])


def infer_input(text: bytes) -> grpcaio.InferInput:
    inp = grpcaio.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    return inp


# --- model repositories and meshes ---------------------------------------------------


def one_bucket(raw: dict[str, Any]) -> None:
    """The FIFO baseline's config: one queue (no length buckets), batches of up to 32 with
    the 16-token bucket's wait."""
    buckets = raw.pop("length_buckets", None) or []
    b16 = next(
        (b for b in buckets if isinstance(b, dict) and b.get("max_length") == 16),
        buckets[0] if buckets and isinstance(buckets[0], dict) else {},
    )
    raw["max_batch_size"] = 32
    batching = raw.setdefault("batching", {}) or {}
    batching["max_batch_wait_ms"] = b16.get(
        "max_batch_wait_ms", batching.get("max_batch_wait_ms", 2)
    )
    raw["batching"] = batching


@dataclass
class Target:
    name: str  # bucketed | fifo
    port: int
    client: grpcaio.InferenceServerClient
    pids: dict[str, int]  # process name -> pid, for the CPU figures


def pids_of(mesh: Mesh) -> dict[str, int]:
    pids = {s.name: s.proc.pid for s in mesh.services}
    if mesh.redis is not None:
        pids["redis"] = mesh.redis.pid
    return {**pids, "bench client": os.getpid()}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU seconds of each process so far (Linux /proc; NaN elsewhere)."""
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = process_cpu_s(pid)
        except (OSError, IndexError, ValueError):
            out[name] = math.nan
    return out


def cores_used(
    before: dict[str, float], after: dict[str, float], wall_s: float
) -> dict[str, float]:
    """CPU cores each process kept busy on average between two snapshots."""
    return {k: (after[k] - before[k]) / wall_s if wall_s > 0 else math.nan for k in after}


# --- load ----------------------------------------------------------------------------


@dataclass
class Answer:
    latency_us: float
    kind: str
    params: dict[str, int]


@dataclass
class Run:
    """One measured phase: answered requests and failures by status."""

    wall_s: float
    answers: list[Answer] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)
    timed_out: bool = False


def params_of(res: Any) -> dict[str, int]:
    """The response's facts; its stage times (`*_ms`, double) as whole microseconds."""
    params = values_of(res.get_response().parameters)
    out: dict[str, int] = {}
    for k in INT_PARAMS:
        if k.endswith("_us"):
            name = k.removesuffix("_us") + "_ms"
            if name in params:
                out[k] = round(params[name] * 1000)
        elif k in params:
            out[k] = int(params[k])
    return out


def status_of(exc: InferenceServerException) -> str:
    return str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")


async def closed_loop(
    client: grpcaio.InferenceServerClient,
    model: str,
    texts: Sequence[TokenText],
    concurrency: int,
    budget_s: float,
) -> Run:
    """Every text once, `concurrency` callers each sending its next as soon as the last is
    answered. Stops at the time budget (the rest counts as not sent)."""
    inputs = [infer_input(t.text) for t in texts]
    indices = iter(range(len(texts)))
    run = Run(0.0)

    async def caller() -> None:
        for i in indices:  # one iterator shared by all callers: each text is sent once
            t0 = time.perf_counter()
            try:
                res = await client.infer(model, [inputs[i]], client_timeout=REQUEST_TIMEOUT_S)
            except InferenceServerException as exc:
                run.failures[status_of(exc)] += 1
                continue
            run.answers.append(
                Answer((time.perf_counter() - t0) * 1e6, texts[i].kind, params_of(res))
            )

    start = time.perf_counter()
    try:
        async with asyncio.timeout(budget_s):
            await asyncio.gather(*(caller() for _ in range(min(concurrency, len(texts)))))
    except TimeoutError:
        run.timed_out = True
    run.wall_s = time.perf_counter() - start
    unsent = len(texts) - len(run.answers) - sum(run.failures.values())
    if unsent:
        run.failures["not answered in budget"] += unsent
    return run


async def open_loop(
    client: grpcaio.InferenceServerClient,
    model: str,
    texts: Sequence[TokenText],
    rate: float,
    priority: int,
) -> Run:
    """Send text i at start + i / rate whatever happened to the others; wait for all."""
    inputs = [infer_input(t.text) for t in texts]
    run = Run(0.0)

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            res = await client.infer(
                model, [inputs[i]], priority=priority, client_timeout=REQUEST_TIMEOUT_S
            )
        except InferenceServerException as exc:
            run.failures[status_of(exc)] += 1
            return
        run.answers.append(Answer((time.perf_counter() - t0) * 1e6, texts[i].kind, params_of(res)))

    start = time.perf_counter()
    tasks = []
    for i in range(len(texts)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    run.wall_s = time.perf_counter() - start
    return run


def flood(
    port: int,
    model: str,
    texts: Sequence[bytes],
    rate: float,
    duration_s: float,
    timeout_s: float,
    max_in_flight: int,
) -> dict[str, Any]:
    """In its own process: priority-2 requests open loop at `rate` for `duration_s`, each
    with a server-side `timeout` of `timeout_s` (and a client one slightly longer); then
    waits for the outstanding ones. Returns counts by outcome."""
    return asyncio.run(_flood(port, model, texts, rate, duration_s, timeout_s, max_in_flight))


async def _flood(
    port: int,
    model: str,
    texts: Sequence[bytes],
    rate: float,
    duration_s: float,
    timeout_s: float,
    max_in_flight: int,
) -> dict[str, Any]:
    client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
    inputs = [infer_input(t) for t in texts]
    outcomes: Counter[str] = Counter()
    messages: Counter[str] = Counter()  # refusals by status and message
    ok_latency_ms: list[float] = []
    ok_stages: dict[str, list[float]] = {s: [] for s in STAGES}
    in_flight = 0

    async def one(i: int) -> None:
        nonlocal in_flight
        t0 = time.perf_counter()
        try:
            res = await client.infer(
                model,
                [inputs[i % len(inputs)]],
                priority=2,
                timeout=int(timeout_s * 1e6),
                client_timeout=timeout_s + 1.0,
            )
            outcomes["OK"] += 1
            ok_latency_ms.append((time.perf_counter() - t0) * 1e3)
            params = params_of(res)
            for stage in STAGES:
                if stage in params:
                    ok_stages[stage].append(params[stage])
        except InferenceServerException as exc:
            outcomes[status_of(exc)] += 1
            # Numbers out (estimates, ms) so that the same reason counts as one line.
            reason = re.sub(r"\d+", "N", f"{status_of(exc)}: {exc.message()}")
            messages[reason[:MESSAGE_CHARS]] += 1
        finally:
            in_flight -= 1

    tasks: set[asyncio.Task[None]] = set()
    start = time.perf_counter()
    sent = 0
    try:
        while (now := time.perf_counter()) - start < duration_s:
            due = int((now - start) * rate) + 1
            while sent < due:
                if in_flight >= max_in_flight:
                    outcomes["not sent (client in-flight cap)"] += 1
                else:
                    in_flight += 1
                    task = asyncio.create_task(one(sent))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                sent += 1
            await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
        send_s = time.perf_counter() - start
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return {
        "offered": sent,
        "offered_rps": sent / send_s if send_s > 0 else 0.0,
        "outcomes": dict(outcomes),
        "messages": dict(messages),
        "ok_p50_ms": float(np.percentile(ok_latency_ms, 50)) if ok_latency_ms else None,
        "ok_stages_p50_ms": {s: pct_ms(v, 50) for s, v in ok_stages.items()},
    }


async def go_flood(
    port: int, model: str, texts: Sequence[bytes], rate: float, duration_s: float, timeout_s: float
) -> dict[str, Any]:
    """The flood of `flood`, sent by the compiled load generator (Poisson arrivals at
    `rate`); the same figures, without refusal messages (the generator keeps codes only),
    and the generator's own CPU as `client_cores`."""
    requests = [
        infer_request(
            model,
            RequestSpec(
                i, "flood", 2, (WorkloadTensor("text", "BYTES", np.array([[t]], np.object_)),)
            ),
            timeout_us=int(timeout_s * 1e6),
        )
        for i, t in enumerate(texts)
    ]
    config = LoadConfig(
        f"127.0.0.1:{port}",
        requests,
        duration_s,
        (timeout_s + 1.0) * 1000,
        mode="open",
        rate_rps=rate,
        seed=int(rate),
        connections=8,
    )
    run = await run_load(default_cache_dir(), config)
    outcomes = Counter(r.outcome.code for r in run.records)
    ok = [r.outcome for r in run.records if r.ok]
    stages: dict[str, list[float]] = {s: [] for s in STAGES}
    for outcome in ok:
        for name, ms in (outcome.reply.stages_ms if outcome.reply else {}).items():
            if f"{name}_us" in stages:
                stages[f"{name}_us"].append(ms * 1000)
    return {
        "offered": len(run.records),
        "offered_rps": len(run.records) / duration_s,
        "outcomes": dict(outcomes),
        "messages": {},
        "ok_p50_ms": float(np.percentile([o.latency_ms for o in ok], 50)) if ok else None,
        "ok_stages_p50_ms": {s: pct_ms(v, 50) for s, v in stages.items()},
        "client_cores": run.cpu_s / run.wall_s if run.wall_s > 0 else math.nan,
    }


def _noop() -> int:
    """Run once in the flood process so its imports happen before any timing."""
    return os.getpid()


# --- figures -------------------------------------------------------------------------


def pct_ms(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) / 1000.0 if values else float("nan")


def mixed_figures(run: Run) -> dict[str, Any]:
    ans = run.answers
    tokens = sum(a.params.get("tokens", 0) for a in ans)
    padded = sum(a.params.get("padded_tokens", 0) for a in ans)
    inverse = sum(1.0 / a.params["batch_size"] for a in ans if a.params.get("batch_size"))
    by_kind = {kind: pct_ms([a.latency_us for a in ans if a.kind == kind], 50) for kind, _ in MIX}
    return {
        "answered": len(ans),
        "failures": dict(run.failures),
        "wall_s": run.wall_s,
        "throughput_rps": len(ans) / run.wall_s if run.wall_s > 0 else 0.0,
        "p50_ms": pct_ms([a.latency_us for a in ans], 50),
        "p99_ms": pct_ms([a.latency_us for a in ans], 99),
        "padding_waste": padded / tokens if tokens else float("nan"),
        # Requests / batches: a batch of b rows answers b requests, each reporting b.
        "mean_batch_size": len(ans) / inverse if inverse else float("nan"),
        "p50_ms_by_kind": by_kind,
        "timed_out": run.timed_out,
    }


def trickle_figures(run: Run, age_limit_ms: float) -> dict[str, Any]:
    """The trickle's latency, its stages, and how many waited (routed -> batch start, what
    the scheduler's aging measures) past their level's age limit."""
    ans = run.answers
    stages: dict[str, list[float]] = {s: [] for s in (*STAGES, OUTSIDE)}
    for a in ans:
        inside = 0
        for s in STAGES:
            if s in a.params:
                stages[s].append(a.params[s])
                inside += a.params[s]
        stages[OUTSIDE].append(a.latency_us - inside)
    return {
        "answered": len(ans),
        "failures": dict(run.failures),
        "p50_ms": pct_ms([a.latency_us for a in ans], 50),
        "p99_ms": pct_ms([a.latency_us for a in ans], 99),
        "stages_p50_ms": {s: pct_ms(v, 50) for s, v in stages.items()},
        "stages_p99_ms": {s: pct_ms(v, 99) for s, v in stages.items()},
        "batch_size_max": max((a.params.get("batch_size", 0) for a in ans), default=0),
        "waited_past_age_limit": sum(
            a.params.get("queue_us", 0) + a.params.get("batch_wait_us", 0) > age_limit_ms * 1000
            for a in ans
        ),
    }


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if isinstance(v, float | int) and not math.isnan(v)]
    return float(statistics.median(finite)) if finite else float("nan")


def ratio(num: float, den: float) -> float:
    return num / den if den and not math.isnan(den) else float("nan")


def without_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


# --- the run -------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def mixed_rounds(
    targets: dict[str, Target], model: str, texts: list[TokenText], args: argparse.Namespace
) -> list[dict[str, Any]]:
    rounds = []
    for r in range(args.repeats):
        order = ["bucketed", "fifo"] if r % 2 == 0 else ["fifo", "bucketed"]
        rnd: dict[str, Any] = {}
        for name in order:
            target = targets[name]
            before, t0 = cpu_seconds(target.pids), time.perf_counter()
            run = await closed_loop(target.client, model, texts, args.concurrency, args.budget_s)
            cores = cores_used(before, cpu_seconds(target.pids), time.perf_counter() - t0)
            rnd[name] = {**mixed_figures(run), "cpu_cores": cores}
        rnd["throughput_ratio"] = ratio(
            rnd["bucketed"]["throughput_rps"], rnd["fifo"]["throughput_rps"]
        )
        rounds.append(rnd)
        log(
            f"mixed round {r + 1}/{args.repeats}: bucketed {rnd['bucketed']['throughput_rps']:.0f}"
            f" req/s, fifo {rnd['fifo']['throughput_rps']:.0f} req/s,"
            f" ratio {rnd['throughput_ratio']:.2f}"
        )
    return rounds


async def priority_rounds(
    target: Target,
    model: str,
    trickle: list[TokenText],
    flood_texts: list[bytes],
    capacity: float,
    age_limit: float,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    client = target.client
    rate = args.trickle_fraction * capacity
    flood_rate = args.flood_factor * capacity
    trickle_s = len(trickle) / rate
    flood_s = args.flood_lead_s + trickle_s + 0.5
    ctx = multiprocessing.get_context("spawn")
    rounds = []
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        loop = asyncio.get_running_loop()
        pids = dict(target.pids)
        if args.flood_client == "python":
            pids["flood client"] = await loop.run_in_executor(pool, _noop)
        for r in range(args.repeats):
            order = ["unloaded", "loaded"] if r % 2 == 0 else ["loaded", "unloaded"]
            rnd: dict[str, Any] = {}
            for phase in order:
                before, t0 = cpu_seconds(pids), time.perf_counter()
                if phase == "unloaded":
                    run = await open_loop(client, model, trickle, rate, priority=1)
                    cores = cores_used(before, cpu_seconds(pids), time.perf_counter() - t0)
                    rnd["unloaded"] = {**trickle_figures(run, age_limit), "cpu_cores": cores}
                    continue
                load = (target.port, model, flood_texts, flood_rate, flood_s, args.flood_timeout_s)
                flooding: asyncio.Future[dict[str, Any]]
                if args.flood_client == "go":
                    flooding = asyncio.ensure_future(go_flood(*load))
                else:
                    flooding = loop.run_in_executor(pool, flood, *load, args.flood_max_in_flight)
                await asyncio.sleep(args.flood_lead_s)
                run = await open_loop(client, model, trickle, rate, priority=1)
                # The CPU figures cover the flood's lead and the trickle, not its drain.
                cores = cores_used(before, cpu_seconds(pids), time.perf_counter() - t0)
                rnd["loaded"] = {**trickle_figures(run, age_limit), "cpu_cores": cores}
                rnd["flood"] = await flooding
                if "client_cores" in rnd["flood"]:  # the generator's, not a process of `pids`
                    rnd["loaded"]["cpu_cores"]["flood client"] = rnd["flood"]["client_cores"]
                await asyncio.sleep(SETTLE_S)
            rnd["p99_ratio"] = ratio(rnd["loaded"]["p99_ms"], rnd["unloaded"]["p99_ms"])
            rounds.append(rnd)
            log(
                f"priority round {r + 1}/{args.repeats}: p99 unloaded"
                f" {rnd['unloaded']['p99_ms']:.1f} ms, loaded {rnd['loaded']['p99_ms']:.1f} ms,"
                f" flood {rnd['flood']['outcomes']}"
            )
    return rounds


def median_cores(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    names = dict.fromkeys(n for row in rows for n in row["cpu_cores"])
    return {n: median_of([row["cpu_cores"].get(n, math.nan) for row in rows]) for n in names}


def summarize(mixed: list[dict[str, Any]], prio: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("throughput_rps", "p50_ms", "p99_ms", "padding_waste", "mean_batch_size")
    meshes = {
        name: {
            **{k: median_of([r[name][k] for r in mixed]) for k in keys},
            "p50_ms_by_kind": {
                kind: median_of([r[name]["p50_ms_by_kind"][kind] for r in mixed]) for kind, _ in MIX
            },
            "failures": sum(sum(r[name]["failures"].values()) for r in mixed),
            "cpu_cores": median_cores([r[name] for r in mixed]),
        }
        for name in ("bucketed", "fifo")
    }
    out: dict[str, Any] = {
        "mixed": meshes,
        "throughput_ratio_per_round": [r["throughput_ratio"] for r in mixed],
        "throughput_ratio": median_of([r["throughput_ratio"] for r in mixed]),
    }
    if prio:
        phases = {}
        for phase in ("unloaded", "loaded"):
            rows = [r[phase] for r in prio]
            phases[phase] = {
                "p50_ms": median_of([x["p50_ms"] for x in rows]),
                "p99_ms": median_of([x["p99_ms"] for x in rows]),
                "failures": sum(sum(x["failures"].values()) for x in rows),
                "batch_size_max": max(x["batch_size_max"] for x in rows),
                "waited_past_age_limit": sum(x["waited_past_age_limit"] for x in rows),
                "answered": sum(x["answered"] for x in rows),
                "stages_p50_ms": {
                    s: median_of([x["stages_p50_ms"][s] for x in rows]) for s in (*STAGES, OUTSIDE)
                },
                "stages_p99_ms": {
                    s: median_of([x["stages_p99_ms"][s] for x in rows]) for s in (*STAGES, OUTSIDE)
                },
                "cpu_cores": median_cores(rows),
            }
        outcomes: Counter[str] = Counter()
        messages: Counter[str] = Counter()
        for r in prio:
            outcomes.update(r["flood"]["outcomes"])
            messages.update(r["flood"]["messages"])
        out["priority"] = {
            **phases,
            "p99_ratio_per_round": [r["p99_ratio"] for r in prio],
            "p99_ratio": median_of([r["p99_ratio"] for r in prio]),
            "flood_offered_rps": median_of([r["flood"]["offered_rps"] for r in prio]),
            "flood_outcomes_total": dict(outcomes),
            "flood_refusals_by_message": dict(messages.most_common()),
            "flood_ok_p50_ms": median_of([r["flood"]["ok_p50_ms"] or math.nan for r in prio]),
            "flood_ok_stages_p50_ms": {
                s: median_of([r["flood"]["ok_stages_p50_ms"][s] for r in prio]) for s in STAGES
            },
        }
    return out


def render(summary: dict[str, Any], config: dict[str, Any]) -> str:
    mixed = summary["mixed"]
    lines = [
        f"model {config['model']}  requests {config['requests']}  concurrency"
        f" {config['concurrency']}  repeats {config['repeats']}  cpus {config['cpus']}",
        f"mix: {config['mix']}",
        f"fifo mesh: {config['fifo_bucket']}",
        "median over rounds",
        "",
        "1. mixed workload at saturation (closed loop)",
        f"  {'mesh':<10}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'padded/real':>13}"
        f"{'mean batch':>12}  {'p50 ms short/medium/long':<26}{'failed':>7}",
    ]
    for name, m in mixed.items():
        kinds = "/".join(f"{m['p50_ms_by_kind'][k]:.1f}" for k, _ in MIX)
        lines.append(
            f"  {name:<10}{m['throughput_rps']:>8.1f}{m['p50_ms']:>9.1f}{m['p99_ms']:>9.1f}"
            f"{m['padding_waste']:>13.2f}{m['mean_batch_size']:>12.1f}  {kinds:<26}"
            f"{m['failures']:>7}"
        )
    per_round = ", ".join(f"{x:.2f}" for x in summary["throughput_ratio_per_round"])
    target = TARGETS["throughput_ratio_min"]
    value = summary["throughput_ratio"]
    lines += [
        f"  throughput bucketed / fifo: {value:.2f}  (rounds: {per_round})"
        f"  target >= {target}: {'met' if value >= target else 'NOT met'}",
        "  padded/real = sum(padded_tokens) / sum(tokens); mean batch = requests / batches",
    ]
    cpu_columns = {"bucketed mixed": mixed["bucketed"], "fifo mixed": mixed["fifo"]}
    prio = summary.get("priority")
    if prio:
        target = TARGETS["priority_p99_ratio_max"]
        value = prio["p99_ratio"]
        per_round = ", ".join(f"{x:.2f}" for x in prio["p99_ratio_per_round"])
        un, lo = prio["unloaded"], prio["loaded"]
        lines += [
            "",
            f"2. priority on the bucketed mesh (capacity {config['capacity_rps']:.1f} req/s"
            " from 1.)",
            f"  trickle: priority 1, short texts, {config['trickle_requests']} requests at"
            f" {config['trickle_rps']:.1f} req/s (open loop), alone and beside the flood",
            f"  flood:   priority 2, mixed texts, offered {config['flood_rps']:.1f} req/s"
            f" (achieved {prio['flood_offered_rps']:.1f}), timeout {config['flood_timeout_s']} s,"
            f" from {config.get('flood_client', 'python')} client",
            f"  {'trickle, ms':<26}{'alone p50':>11}{'alone p99':>11}{'flood p50':>11}"
            f"{'flood p99':>11}",
            f"  {'client latency':<26}{un['p50_ms']:>11.1f}{un['p99_ms']:>11.1f}"
            f"{lo['p50_ms']:>11.1f}{lo['p99_ms']:>11.1f}",
        ]
        for stage in (*STAGES, OUTSIDE):
            label = stage
            lines.append(
                f"  {label:<26}{un['stages_p50_ms'][stage]:>11.1f}"
                f"{un['stages_p99_ms'][stage]:>11.1f}{lo['stages_p50_ms'][stage]:>11.1f}"
                f"{lo['stages_p99_ms'][stage]:>11.1f}"
            )
        flood_counts = ", ".join(
            f"{k} {v}" for k, v in sorted(prio["flood_outcomes_total"].items())
        )
        lines += [
            f"  {'failed':<26}{un['failures']:>11}{'':>11}{lo['failures']:>11}",
            f"  {'largest batch (rows)':<26}{un['batch_size_max']:>11}{'':>11}"
            f"{lo['batch_size_max']:>11}",
            f"  {'waited > age limit':<26}{un['waited_past_age_limit']:>11}{'':>11}"
            f"{lo['waited_past_age_limit']:>11}"
            f"   (of {un['answered']} / {lo['answered']}; priority-1 limit"
            f" {config['age_limit_ms']:.0f} ms, routed -> batch start)",
            f"  p99 beside flood / alone: {value:.2f}  (rounds: {per_round})"
            f"  target <= {target}: {'met' if value <= target else 'NOT met'}",
            f"  flood outcomes, all rounds: {flood_counts}",
            *(
                f"    {n:>6}  {m}"
                for m, n in list(prio["flood_refusals_by_message"].items())[:MESSAGE_LINES]
            ),
            f"  flood answered p50: {prio['flood_ok_p50_ms']:.0f} ms; stage p50s ms: "
            + ", ".join(
                f"{s.removesuffix('_us')} {v:.1f}"
                for s, v in prio["flood_ok_stages_p50_ms"].items()
            ),
            "  stage percentiles are taken per stage (they do not add up to the latency's);"
            f" {OUTSIDE} = client latency minus the stages (client <-> gateway, tritonclient)",
        ]
        cpu_columns |= {"trickle alone": un, "trickle + flood": lo}
    names = list(dict.fromkeys(n for c in cpu_columns.values() for n in c["cpu_cores"]))
    lines += [
        "",
        f"CPU cores busy per process (median over rounds; this machine has {config['cpus']})",
        f"  {'process':<16}" + "".join(f"{c:>17}" for c in cpu_columns),
    ]
    for n in [*names, "total"]:
        cells = []
        for c in cpu_columns.values():
            cores = c["cpu_cores"]
            v = (
                sum(x for x in cores.values() if not math.isnan(x))
                if n == "total"
                else cores.get(n, math.nan)
            )
            cells.append(f"{v:>17.2f}" if not math.isnan(v) else f"{'-':>17}")
        lines.append(f"  {n:<16}" + "".join(cells))
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    model_dir = REPO_ROOT / "models" / args.model
    raw = yaml.safe_load((model_dir / "config.yaml").read_text())
    max_length = int(raw["tokenize"]["max_length"])
    age_limit = parse_config(raw, str(model_dir)).scheduling.age_limit(1)
    long_tokens = (200, 250) if max_length >= 250 else (110, min(128, max_length))
    tok = counting_tokenizer(model_dir)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    texts = make_texts(tok, rng, args.requests, long_tokens)
    warmup = make_texts(tok, rng, args.warmup, long_tokens)
    flood_pool = [t.text for t in make_texts(tok, rng, args.flood_pool, long_tokens)]
    short = make_texts(tok, rng, args.trickle_requests, long_tokens, kinds=(("short", 1.0),))
    log(f"texts ready in {time.perf_counter() - t0:.1f}s")
    if args.flood_client == "go" and not args.skip_priority:
        try:
            goload_binary(default_cache_dir())
        except LoadUnavailable as exc:
            log(f"no compiled load generator ({exc}); the flood comes from a Python process")
            args.flood_client = "python"
    meshes: dict[str, Mesh] = {}
    targets: dict[str, Target] = {}
    mixed: list[dict[str, Any]] = []
    prio: list[dict[str, Any]] = []
    config: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tiermesh-sched-") as tmp:
        try:
            for name in ("bucketed", "fifo"):
                base = Path(tmp) / name
                repo = mirror_model(
                    model_dir, base / "models", one_bucket if name == "fifo" else None
                )
                port = free_port()
                mesh = Mesh(
                    UpOptions(
                        port=port,
                        # Two meshes at once: every port of each its own (0: a free one).
                        http_port=0,
                        metrics_port=0,
                        data_dir=base / "data",
                        model_repository=repo,
                        grace_s=5.0,
                        extra_env={"TIERMESH_LOG_LEVEL": "warning"},
                    )
                )
                meshes[name] = mesh
                started = time.perf_counter()
                mesh.start()
                client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
                targets[name] = Target(name, port, client, pids_of(mesh))
                log(f"{name} mesh on 127.0.0.1:{port} in {time.perf_counter() - started:.1f}s")
            for target in targets.values():
                warm = await closed_loop(
                    target.client, args.model, warmup, args.concurrency, args.budget_s
                )
                if warm.failures:
                    raise RuntimeError(f"{target.name} warm-up failed: {dict(warm.failures)}")
            mixed = await mixed_rounds(targets, args.model, texts, args)
            capacity = median_of([r["bucketed"]["throughput_rps"] for r in mixed])
            trickle_rate = args.trickle_fraction * capacity
            # Bound the trickle's duration: fewer requests when the mesh is slow.
            count = max(10, min(len(short), int(trickle_rate * args.trickle_max_s)))
            short = short[:count]
            config = {
                "capacity_rps": capacity,
                "trickle_rps": trickle_rate,
                "trickle_requests": len(short),
                "flood_rps": args.flood_factor * capacity,
                "flood_client": args.flood_client,
                "flood_timeout_s": args.flood_timeout_s,
                "age_limit_ms": age_limit,
            }
            if capacity > 0 and not args.skip_priority:
                prio = await priority_rounds(
                    targets["bucketed"], args.model, short, flood_pool, capacity, age_limit, args
                )
        finally:
            for target in targets.values():
                await target.client.close()
            for name, mesh in meshes.items():
                log(f"{name} mesh stopped {mesh.stop()}")

    kinds = Counter(t.kind for t in texts)
    tokens = {k: [t.tokens for t in texts if t.kind == k] for k in kinds}
    config = {
        "model": args.model,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "mix": ", ".join(
            f"{k} {kinds[k]} ({min(tokens[k])}-{max(tokens[k])} tokens)"
            for k, _ in MIX
            if k in kinds
        ),
        "fifo_bucket": "one bucket: max_batch_size 32, wait of the 16-token bucket",
        **config,
    }
    summary = summarize(mixed, prio)
    print(render(summary, config))
    if args.json is not None:
        doc = {
            "config": config,
            "targets": TARGETS,
            **summary,
            "rounds": {"mixed": mixed, "priority": prio},
        }
        args.json.write_text(json.dumps(without_nan(doc), indent=2, allow_nan=False) + "\n")
        log(f"wrote {args.json}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--model", default="minilm-l3", help="a text model of models/")
    p.add_argument("--requests", type=int, help="mixed requests per mesh and round (600)")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop callers (64)")
    p.add_argument("--repeats", type=int, help="rounds; medians are reported (3)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="a short run (~1.5 min)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, help="mixed requests per mesh before measuring (128)")
    p.add_argument("--budget-s", type=float, default=60.0, help="cap of one closed-loop run")
    p.add_argument("--trickle-requests", type=int, help="priority-1 requests per phase (100)")
    p.add_argument("--trickle-fraction", type=float, default=0.05, help="of capacity")
    p.add_argument("--trickle-max-s", type=float, help="cap of one trickle phase (20)")
    p.add_argument("--flood-factor", type=float, default=2.0, help="flood rate / capacity")
    p.add_argument("--flood-timeout-s", type=float, default=2.0)
    p.add_argument("--flood-lead-s", type=float, default=1.5, help="flood alone before trickle")
    p.add_argument("--flood-max-in-flight", type=int, default=2000, help="python client only")
    p.add_argument(
        "--flood-client",
        choices=("go", "python"),
        default="go",
        help="the compiled generator (default; python when Go is missing) or a Python process",
    )
    p.add_argument("--flood-pool", type=int, default=1000, help="distinct flood texts")
    p.add_argument("--skip-priority", action="store_true", help="only the mixed workload")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "requests": 300 if quick else 600,
        "repeats": 2 if quick else 3,
        "warmup": 64 if quick else 128,
        "trickle_requests": 40 if quick else 100,
        "trickle_max_s": 8.0 if quick else 20.0,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.requests, args.concurrency, args.repeats, args.warmup, args.trickle_requests) < 1:
        p.error("--requests, --concurrency, --repeats, --warmup, --trickle-requests must be >= 1")
    if not (REPO_ROOT / "models" / args.model / "config.yaml").is_file():
        p.error(f"no model {args.model!r} in {REPO_ROOT / 'models'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
