"""The whole mesh against the raw onnxruntime limit on MiniLM-L3 FP32, a 70/25/5 length mix.

One run, one model file (minilm-l3 `model.onnx`), one machine, the same seeded inputs:

- raw: onnxruntime in this process at its best batch size per length (chosen once at the
  start from --raw-batches), the mix grouped by length: the limit; per length the better
  of one call at a time and the worker's compute lanes (several calls at once, `Raw`).
  Also batch 1 at 16 tokens, one call after the other: the latency floor.
- mesh: `tiermesh up` as `make run` starts it (redis-server, postprocess, router, center
  and edge workers, gateway; default settings and log level), on a private repository
  holding only minilm-l3 with its FP32 variant for every request (no tiers: the edge
  worker's INT8 would be another model) and a 256-token bucket (the committed config stops
  at 128). Driven by the bench tools (`tiermesh.bench` Sender + closed loop) at the
  concurrency that maximises throughput (picked once at the start from --concurrencies),
  on pre-tokenized ids (`minilm-l3-ids`) and on raw text (`minilm-l3`, tokenized by the
  router): the same sequences.
- mesh at concurrency 1, 16 tokens (ids and text): latency overhead.

Per round (rounds interleave raw and mesh, the order alternating), and the median over the
rounds: the ratios of issue 10, and CPU seconds per request of every mesh process (from
/proc) with the worker's onnxruntime CPU (`tiermesh_onnxruntime_cpu_seconds`) taken out;
and the mesh's CPU per request minus raw onnxruntime's CPU per sequence of the mix (issue
21's acceptance 1; unlike "outside onnxruntime" it also charges the mesh for running
smaller, padded batches than raw's best).
It asserts nothing. All traffic goes to 127.0.0.1, bounded in count and time.

    .venv/bin/python benchmarks/mesh_vs_raw.py [--repeats 3] [--requests 1500] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tritonclient.grpc.aio as grpcaio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from tokenizers import Tokenizer

from tiermesh.bench import runner
from tiermesh.bench.calls import Sender
from tiermesh.bench.cpu import process_cpu_s
from tiermesh.bench.records import Record
from tiermesh.bench.workload import (
    RequestSpec,
    WorkloadTensor,
    counting_tokenizer,
    text_with_tokens,
)
from tiermesh.core.model_files import mirror_model
from tiermesh.core.settings import WorkerSettings
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions
from tiermesh.worker.lanes import cores_available, plan
from tiermesh.worker.runner import session_options

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "minilm-l3"
IDS_MODEL = "minilm-l3-ids"
# Requests of each length per block of 20: the 70/25/5 mix, and the short-text mix
# (75% 16 / 25% 64 tokens) of issue 21's second figure.
MIXES = {"default": {16: 14, 64: 5, 256: 1}, "short": {16: 15, 64: 5}}
Shares = dict[int, int]
TIMEOUT_S = 30.0

Ids = npt.NDArray[np.int64]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- inputs --------------------------------------------------------------------------


def exact_text(tok: Tokenizer, rng: np.random.Generator, n: int) -> tuple[str, list[int]]:
    """A text of plain words that tokenizes to exactly n tokens ([CLS] and [SEP] included)."""
    while True:
        text, count = text_with_tokens(tok, rng, n)
        if count == n:
            return text, tok.encode(text).ids


def make_inputs(seed: int, count: int, shares: Shares) -> list[tuple[int, str, list[int]]]:
    """`count` requests (length, text, ids): the mix in exact proportions per block of 20,
    shuffled; the same every round and for both workloads."""
    tok = counting_tokenizer(REPO_ROOT / "models" / MODEL)
    rng = np.random.default_rng(seed)
    pool = {n: [exact_text(tok, rng, n) for _ in range(16)] for n in shares}
    block = [n for n, k in shares.items() for _ in range(k)]
    lengths = [block[i % len(block)] for i in range(count)]
    rng.shuffle(lengths)
    out = []
    for i, n in enumerate(lengths):
        text, ids = pool[n][i % len(pool[n])]
        out.append((n, text, ids))
    return out


def spec_ids(i: int, n: int, ids: list[int]) -> RequestSpec:
    arr = np.asarray([ids], dtype=np.int64)
    return RequestSpec(
        i,
        str(n),
        2,
        (
            WorkloadTensor("input_ids", "INT64", arr),
            WorkloadTensor("attention_mask", "INT64", np.ones_like(arr)),
        ),
    )


def spec_text(i: int, n: int, text: str) -> RequestSpec:
    arr = np.array([[text.encode()]], dtype=np.object_)
    return RequestSpec(i, str(n), 2, (WorkloadTensor("text", "BYTES", arr),))


# --- raw onnxruntime -------------------------------------------------------------------


class Raw:
    """onnxruntime alone, on the cores the mesh gets: the better of one call at a time
    with onnxruntime's default threads and the worker's compute lanes (worker/lanes.py
    `plan`: on 2 cores two one-thread calls at once on one session), per length, so the
    mesh is held to the best raw use of the cores, not to the one it happens to share."""

    def __init__(self, model_path: Path, seqs: dict[int, list[int]], shares: Shares) -> None:
        settings = WorkerSettings()
        lanes = plan(settings.intra_op_threads, settings.compute_lanes, cores_available())
        self.modes: dict[str, tuple[ort.InferenceSession, int]] = {
            "one call": (self._session(model_path, settings.intra_op_threads), 1),
        }
        if lanes.lanes > 1:
            self.modes[f"{lanes.lanes} lanes x {lanes.threads} thread(s)"] = (
                self._session(model_path, lanes.threads),
                lanes.lanes,
            )
        self.seqs = seqs
        self.shares = shares
        self.best: dict[int, int] = {}  # length -> best batch, over the modes
        self.best_mode: dict[int, str] = {}

    @staticmethod
    def _session(model_path: Path, threads: int) -> ort.InferenceSession:
        return ort.InferenceSession(
            str(model_path), session_options(threads), providers=["CPUExecutionProvider"]
        )

    def feeds(self, n: int, batch: int) -> dict[str, Ids]:
        ids = np.asarray([self.seqs[n]] * batch, dtype=np.int64)
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}

    def per_seq(self, n: int, batch: int, min_s: float, mode: str) -> tuple[float, float]:
        """Wall and CPU seconds per sequence (this process's CPU, every onnxruntime thread
        included: nothing else runs here meanwhile), `lanes` threads calling the mode's
        session at once."""
        session, lanes = self.modes[mode]
        feeds = self.feeds(n, batch)
        session.run(None, feeds)
        calls = [0] * lanes
        c0 = time.process_time()
        t0 = time.perf_counter()

        def lane(i: int) -> None:
            while calls[i] < 2 or time.perf_counter() - t0 < min_s:
                session.run(None, feeds)
                calls[i] += 1

        threads = [threading.Thread(target=lane, args=(i,)) for i in range(lanes)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seqs = sum(calls) * batch
        return (time.perf_counter() - t0) / seqs, (time.process_time() - c0) / seqs

    def calibrate(self, batches: Sequence[int]) -> None:
        for n in self.shares:
            times = {
                (mode, b): self.per_seq(n, b, 0.3, mode)[0] for mode in self.modes for b in batches
            }
            mode, batch = min(times, key=lambda k: times[k])
            self.best[n], self.best_mode[n] = batch, mode
            log(f"raw best at {n} tokens: batch {batch}, {mode} ({1 / times[mode, batch]:.0f}/s)")

    def limit(self) -> dict[str, float]:
        """The mix's sequences per second at the best batch and mode per length, and each
        length's; and the CPU the mix costs raw onnxruntime per sequence there (the
        acceptance's "raw onnxruntime's CPU per sequence for the same mix")."""
        per = {n: self.per_seq(n, self.best[n], 0.6, self.best_mode[n]) for n in self.shares}
        total = sum(self.shares.values())
        mix_s = sum(per[n][0] * k / total for n, k in self.shares.items())
        mix_cpu_s = sum(per[n][1] * k / total for n, k in self.shares.items())
        return {
            "mix_rps": 1 / mix_s,
            "mix_cpu_us_per_seq": mix_cpu_s * 1e6,
            **{f"rps_{n}": 1 / per[n][0] for n in self.shares},
        }

    def described(self) -> dict[int, str]:
        return {n: f"{self.best[n]} ({self.best_mode[n]})" for n in self.best}

    def b1_p50_ms(self, calls: int) -> float:
        """Batch 1 at 16 tokens, one call after the other: the faster session's p50."""
        feeds = self.feeds(16, 1)
        best = float("inf")
        for session, _ in self.modes.values():
            session.run(None, feeds)
            lat = []
            for _ in range(calls):
                t0 = time.perf_counter()
                session.run(None, feeds)
                lat.append(time.perf_counter() - t0)
            best = min(best, statistics.median(lat) * 1e3)
        return best


# --- the mesh ------------------------------------------------------------------------


def fp32_up_to_256(raw: dict[str, Any]) -> None:
    """minilm-l3 alone: FP32 for everything (no tiers), tokenizer up to 256 tokens and a
    256-token bucket (batch 2: raw onnxruntime gains nothing past it there)."""
    raw.pop("tiers", None)
    raw.pop("cascade", None)
    raw["tokenize"]["max_length"] = 256
    raw["length_buckets"].append({"max_length": 256, "max_batch_size": 2, "max_batch_wait_ms": 4})


def proc_cpu(pid: int) -> float:
    try:
        return process_cpu_s(pid)
    except OSError:
        return 0.0


def scrape(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


class MeshRun:
    def __init__(self, mesh: Mesh, client: grpcaio.InferenceServerClient) -> None:
        self.mesh = mesh
        self.client = client
        self.pids = {s.name: s.proc.pid for s in mesh.services}
        if mesh.redis is not None:
            self.pids["redis"] = mesh.redis.pid
        # Every worker's onnxruntime counters (the center's further workers too).
        self.worker_metrics = [
            port for name, port in mesh.metrics_ports.items() if name.startswith("worker")
        ]

    def cpu(self) -> dict[str, float]:
        out = {name: proc_cpu(pid) for name, pid in self.pids.items()}
        ports = self.worker_metrics
        out["ort"] = sum(scrape(p, "tiermesh_onnxruntime_cpu_seconds_total") for p in ports)
        out["ort_wall"] = sum(scrape(p, "tiermesh_onnxruntime_seconds_total") for p in ports)
        out["client"] = sum(os.times()[:2])
        return out

    async def load(
        self, model: str, specs: list[RequestSpec], concurrency: int
    ) -> tuple[list[Record], float, dict[str, float]]:
        send = Sender(self.client, model, TIMEOUT_S)
        rec = runner.RunRecorder()
        it: Iterator[RequestSpec] = iter(specs)
        before = self.cpu()
        t0 = time.perf_counter()
        await runner.closed_loop(
            send,
            it,
            rec,
            concurrency=concurrency,
            limit=len(specs),
            until=rec.clock() + 600,
        )
        wall = time.perf_counter() - t0
        after = self.cpu()
        return rec.records, wall, {k: after[k] - before[k] for k in after}


def throughput_case(records: list[Record], wall: float, cpu: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    n = max(len(ok), 1)
    per_req_us = {k: v / n * 1e6 for k, v in cpu.items()}
    mesh_keys = [k for k in cpu if k not in ("ort", "ort_wall", "client")]
    total = sum(cpu[k] for k in mesh_keys)
    return {
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "first_error": next((r.outcome.code for r in records if not r.ok), ""),
        "rps": len(ok) / wall,
        "p50_ms": float(np.median([r.outcome.latency_ms for r in ok])) if ok else float("nan"),
        "cpu_us_per_req": per_req_us,
        "mesh_cpu_us_per_req": total / n * 1e6,
        "outside_ort_us_per_req": (total - cpu["ort"]) / n * 1e6,
    }


def latency_case(records: list[Record]) -> float:
    ok = [r.outcome.latency_ms for r in records if r.ok]
    return float(np.median(ok)) if ok else float("nan")


class OtlpSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that counts spans and keeps none: what a variant with
    `OTEL_EXPORTER_OTLP_ENDPOINT={otlp}` exports to (its cost is the benchmark's, not the
    mesh's)."""

    def __init__(self, server: grpc.aio.Server, port: int) -> None:
        self.server = server
        self.endpoint = f"http://127.0.0.1:{port}"
        self.spans = 0

    @classmethod
    async def start(cls) -> OtlpSink:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        port = server.add_insecure_port("127.0.0.1:0")
        sink = cls(server, port)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
        await server.start()
        return sink

    async def Export(self, request, context):  # type: ignore[no-untyped-def]
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                self.spans += len(ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    async def settled(self, quiet_s: float = 6.0, within_s: float = 30.0) -> None:
        """Returns once no span came for `quiet_s` (a traced mesh's exporter sends what it
        holds every 5 s), or after `within_s`: what the sink receives is this process's
        CPU, and raw onnxruntime's CPU is measured here next."""
        deadline = time.perf_counter() + within_s
        seen, since = self.spans, time.perf_counter()
        while time.perf_counter() < deadline and time.perf_counter() - since < quiet_s:
            await asyncio.sleep(0.25)  # a poll period, not a synchronisation
            if self.spans != seen:
                seen, since = self.spans, time.perf_counter()

    async def stop(self) -> None:
        await self.server.stop(None)


# --- rounds and report ---------------------------------------------------------------


async def one_round(
    raw: Raw,
    meshes: dict[str, MeshRun],
    ids_specs: list[RequestSpec],
    text_specs: list[RequestSpec],
    c1_ids: list[RequestSpec],
    c1_text: list[RequestSpec],
    concurrency: int,
    shift: int,
    sink: OtlpSink | None = None,
) -> dict[str, Any]:
    """Raw, then every mesh, in an order rotated by `shift` (rounds interleave)."""
    out: dict[str, Any] = {}

    async def raw_cases() -> None:
        if sink is not None:
            await sink.settled()
        out["raw"] = raw.limit()
        out["raw_b1_p50_ms"] = raw.b1_p50_ms(300)

    def mesh_cases(name: str, mesh: MeshRun) -> Callable[[], Any]:
        async def cases() -> None:
            o: dict[str, Any] = {}
            o["mesh_ids"] = throughput_case(*await mesh.load(IDS_MODEL, ids_specs, concurrency))
            o["mesh_text"] = throughput_case(*await mesh.load(MODEL, text_specs, concurrency))
            o["c1_ids_p50_ms"] = latency_case((await mesh.load(IDS_MODEL, c1_ids, 1))[0])
            o["c1_text_p50_ms"] = latency_case((await mesh.load(MODEL, c1_text, 1))[0])
            out[name] = o

        return cases

    steps: list[Callable[[], Any]] = [raw_cases, *(mesh_cases(n, m) for n, m in meshes.items())]
    k = shift % len(steps)
    for step in steps[k:] + steps[:k]:
        await step()
    lim = out["raw"]["mix_rps"]
    for name in meshes:
        o = out[name]
        o["ratio_ids"] = o["mesh_ids"]["rps"] / lim
        o["ratio_text"] = o["mesh_text"]["rps"] / lim
        for w in ("ids", "text"):
            case = o[f"mesh_{w}"]
            case["minus_raw_cpu_us_per_req"] = (
                case["mesh_cpu_us_per_req"] - out["raw"]["mix_cpu_us_per_seq"]
            )
        o["c1_ids_minus_raw_ms"] = o["c1_ids_p50_ms"] - out["raw_b1_p50_ms"]
        o["c1_text_minus_raw_ms"] = o["c1_text_p50_ms"] - out["raw_b1_p50_ms"]
    return out


def med(rounds: list[dict[str, Any]], *path: str) -> float:
    vals = []
    for r in rounds:
        v: Any = r
        for p in path:
            v = v[p]
        vals.append(float(v))
    return statistics.median(vals)


def report(
    rounds: list[dict[str, Any]], names: Sequence[str], concurrency: int, best: dict[int, str]
) -> str:
    lines = [
        f"rounds: {len(rounds)}; mesh concurrency {concurrency}; raw best batch {best}",
        f"raw limit (mix, best batch and mode per length): "
        f"{med(rounds, 'raw', 'mix_rps'):8.1f} seq/s"
        + "".join(f"  [{n}: {med(rounds, 'raw', f'rps_{n}'):.0f}/s]" for n in best),
        f"raw CPU per sequence (mix, there):      "
        f"{med(rounds, 'raw', 'mix_cpu_us_per_seq'):8.0f} us",
        f"raw batch-1 p50, 16 tokens:             {med(rounds, 'raw_b1_p50_ms'):8.3f} ms",
    ]
    for v in names:
        lines.append(f"== mesh {v}")
        for w in ("ids", "text"):
            k = f"mesh_{w}"
            lines.append(
                f"{w:<4} c{concurrency}: {med(rounds, v, k, 'rps'):7.1f} req/s "
                f"(ratio to raw limit {med(rounds, v, f'ratio_{w}'):.3f}), "
                f"p50 {med(rounds, v, k, 'p50_ms'):.1f} ms, "
                f"errors {max(r[v][k]['errors'] for r in rounds)}"
            )
            lines.append(
                f"  CPU us/request: mesh total {med(rounds, v, k, 'mesh_cpu_us_per_req'):.0f}, "
                f"outside onnxruntime {med(rounds, v, k, 'outside_ort_us_per_req'):.0f}, "
                f"minus raw CPU per sequence {med(rounds, v, k, 'minus_raw_cpu_us_per_req'):.0f}"
            )
            procs = rounds[0][v][k]["cpu_us_per_req"].keys()
            lines.append(
                "    "
                + ", ".join(f"{n} {med(rounds, v, k, 'cpu_us_per_req', n):.0f}" for n in procs)
            )
        for w in ("ids", "text"):
            lines.append(
                f"{w:<4} c1 16 tokens p50: {med(rounds, v, f'c1_{w}_p50_ms'):.3f} ms; "
                f"minus raw batch-1 p50: {med(rounds, v, f'c1_{w}_minus_raw_ms'):.3f} ms"
            )
        lines.append(
            "  per round: ratio ids / text, c1 ids - raw ms, outside-ORT us/req ids / text"
        )
        for i, r in enumerate(rounds):
            o = r[v]
            lines.append(
                f"  {i + 1}: {o['ratio_ids']:.3f} / {o['ratio_text']:.3f}, "
                f"{o['c1_ids_minus_raw_ms']:.3f}, {o['mesh_ids']['outside_ort_us_per_req']:.0f} / "
                f"{o['mesh_text']['outside_ort_us_per_req']:.0f}"
            )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--requests", type=int, default=1500, help="mesh requests per case")
    p.add_argument("--requests-c1", type=int, default=150)
    p.add_argument("--concurrency", type=int, default=0, help="0: pick from --concurrencies")
    p.add_argument("--concurrencies", default="16,32,64")
    p.add_argument("--raw-batches", default="1,2,4,8,16,32,64")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="default",
        help="default: 70/25/5 %% of 16/64/256 tokens; short: 75/25 %% of 16/64",
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[:K=V,...]",
        help="a mesh with extra environment (repeatable; all run side by side in each "
        "round). Default: one mesh, `default`, environment as make run. `{otlp}` in a value "
        "is the address of an OTLP trace receiver this script runs, e.g. "
        "traced:OTEL_EXPORTER_OTLP_ENDPOINT={otlp} (every request sampled); "
        "PYTHONPATH=CHECKOUT/services runs another checkout's Python services (before/"
        "after); the Go front door is built from this checkout whatever PYTHONPATH says "
        "(`up` runs in this process): vary it by its environment (TIERMESH_FRONT_DOOR_PLACES, "
        "GOGC, TIERMESH_FRONT_DOOR=python).",
    )
    return p.parse_args(argv)


async def run(args: argparse.Namespace) -> int:
    shares = MIXES[args.mix]
    inputs = make_inputs(args.seed, args.requests, shares)
    seqs = {n: next(ids for m, _, ids in inputs if m == n) for n in shares}
    ids_specs = [spec_ids(i, n, ids) for i, (n, _, ids) in enumerate(inputs)]
    text_specs = [spec_text(i, n, t) for i, (n, t, _) in enumerate(inputs)]
    short = [(n, t, ids) for n, t, ids in inputs if n == 16][: args.requests_c1]
    c1_ids = [spec_ids(i, n, ids) for i, (n, _, ids) in enumerate(short)]
    c1_text = [spec_text(i, n, t) for i, (n, t, _) in enumerate(short)]
    raw = Raw(REPO_ROOT / "models" / MODEL / "1" / "model.onnx", seqs, shares)
    raw.calibrate([int(b) for b in args.raw_batches.split(",")])
    wanted = args.variant or ["default"]
    # The OTLP receiver runs only for a variant that exports to it.
    sink = await OtlpSink.start() if any("{otlp}" in item for item in wanted) else None
    variants: dict[str, dict[str, str]] = {}
    for item in wanted:
        name, _, pairs = item.partition(":")
        variants[name] = {
            k: v.replace("{otlp}", sink.endpoint if sink is not None else "")
            for k, _, v in (kv.partition("=") for kv in pairs.split(",") if kv)
        }
    with tempfile.TemporaryDirectory(prefix="tiermesh-raw-") as tmp:
        repo = mirror_model(REPO_ROOT / "models" / MODEL, Path(tmp) / "models", fp32_up_to_256)
        meshes: dict[str, MeshRun] = {}
        started: list[Mesh] = []
        clients: list[grpcaio.InferenceServerClient] = []
        try:
            for name, env in variants.items():
                port = free_port()
                mesh = Mesh(
                    UpOptions(
                        port=port,
                        data_dir=Path(tmp) / f"data-{name}",
                        model_repository=repo,
                        http_port=0,
                        metrics_port=0,
                        grace_s=5.0,
                        extra_env=env,
                    )
                )
                started.append(mesh)
                mesh.start()
                clients.append(grpcaio.InferenceServerClient(f"127.0.0.1:{port}"))
                meshes[name] = MeshRun(mesh, clients[-1])
                await meshes[name].load(IDS_MODEL, ids_specs[:200], 32)
                await meshes[name].load(MODEL, text_specs[:200], 32)
                log(f"mesh {name} up: {env}")
            concurrency = args.concurrency
            if not concurrency:
                first = next(iter(meshes.values()))
                best = 0.0
                for c in (int(x) for x in args.concurrencies.split(",")):
                    recs, wall, _ = await first.load(IDS_MODEL, ids_specs[:600], c)
                    rps = sum(r.ok for r in recs) / wall
                    log(f"concurrency {c}: {rps:.0f} req/s")
                    if rps > best:
                        best, concurrency = rps, c
            rounds = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                rounds.append(
                    await one_round(
                        raw, meshes, ids_specs, text_specs, c1_ids, c1_text, concurrency, r, sink
                    )
                )
                log(f"round {r + 1}/{args.repeats} in {time.perf_counter() - t0:.1f}s")
        finally:
            for client in clients:
                await client.close()
            for mesh in started:
                mesh.stop()
            if sink is not None:
                await sink.stop()
    if sink is not None:
        log(f"OTLP sink received {sink.spans} spans")
    commit = git_commit()
    print(f"mesh_vs_raw {time.strftime('%Y-%m-%d %H:%M')} commit {commit} (+ working tree)")
    print(report(rounds, list(variants), concurrency, raw.described()))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"concurrency": concurrency, "variants": variants, "rounds": rounds}, indent=1
            )
        )
    return 0


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
