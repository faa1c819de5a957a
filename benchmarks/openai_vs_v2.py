"""Issue 25: /v1/embeddings (the OpenAI door) against v2 gRPC, the same 32-text lists.

One mesh, `tiermesh up`'s defaults (center and edge workers, the Go front door on the gRPC
port, internal mTLS), started in this process as mesh_vs_raw.py starts it
(tiermesh.up.supervisor.Mesh) on the repository models/ (minilm-l6 fetched). Two sides:

- openai: `openai.AsyncOpenAI(...).embeddings.create(model, input=list)` on the REST port's
  /v1 (base64, as the client asks by default; the door splits a list into jobs by length);
- v2: `tritonclient.grpc.aio`, each list as one [32, 1] BYTES request to the gRPC port.

Each phase is a closed loop of --concurrency callers (each sends the next list as soon as
its answer came) for --phase-s seconds; rounds alternate which side goes first (A B, B A,
A B...), after one discarded warm-up phase per side. Every phase's client is a process of
its own (this script with --client), in a session of its own (its own autogroup share of
the CPU, as a client on another machine has): it shares no GIL with the other side, it is
started and warmed before the clock starts, and it measures its own CPU over the phase
alone. The mesh processes' CPU comes from /proc before and after.

Texts: the English lines (4-16 words) of the optimize text sets (tiermesh.optimize.datasets),
seeded: --mix per cent of one sentence / sentences joined and cut to 17-35 words / to
36-60 words; the same lists for both sides. It asserts nothing; all traffic is 127.0.0.1.

    .venv/bin/python benchmarks/openai_vs_v2.py [--phase-s 15] [--repeats 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import openai
import tritonclient.grpc.aio as grpcaio

from tiermesh.bench import cpu
from tiermesh.bench.mdtable import table
from tiermesh.bench.stats import percentile
from tiermesh.optimize.datasets import builtin_texts
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL, OUTPUT = "minilm-l6", "sentence_embedding"
SIDES = ("openai", "v2")
TIMEOUT_S = 30.0
# Words of the joined classes (the short class is one sentence of the pool, 4-16 words).
SPANS = ((17, 35), (36, 60))
Vectors = npt.NDArray[np.float32]
Call = Callable[[list[str]], Awaitable[Vectors]]


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def make_lists(seed: int, count: int, rows: int, mix: str) -> list[list[str]]:
    weights = [int(x) for x in mix.split(",")]
    pool = [
        t
        for t in builtin_texts("eval") + builtin_texts("calibration")
        if t.isascii() and 4 <= len(t.split()) <= 16
    ]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        texts = []
        for kind in rng.choices(range(3), weights=weights, k=rows):
            if kind == 0:
                texts.append(rng.choice(pool))
                continue
            target = rng.randint(*SPANS[kind - 1])
            words: list[str] = []
            while len(words) < target:
                words += rng.choice(pool).split()
            texts.append(" ".join(words[:target]))
        out.append(texts)
    return out


# --- the two sides (each in its client process; both in this one for the vector check) ---


def side(name: str, port: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """A call that sends one list and returns its vectors, and the client's close."""
    if name == "openai":
        oa = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=TIMEOUT_S
        )

        async def embed(texts: list[str]) -> Vectors:
            res = await oa.embeddings.create(model=MODEL, input=texts)
            return np.asarray([d.embedding for d in res.data], dtype=np.float32)

        return embed, oa.close
    v2 = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
    wanted = [grpcaio.InferRequestedOutput(OUTPUT)]

    async def infer(texts: list[str]) -> Vectors:
        # Built per call, as the OpenAI client builds its JSON body per call.
        inp = grpcaio.InferInput("text", [len(texts), 1], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_)[:, None])
        res = await v2.infer(MODEL, [inp], outputs=wanted, client_timeout=TIMEOUT_S)
        out: Vectors = res.as_numpy(OUTPUT)
        return out

    return infer, v2.close


async def closed_loop(
    call: Call, lists: list[list[str]], concurrency: int, seconds: float
) -> dict[str, Any]:
    """Rows/s and requests/s count what was answered within `seconds` (the callers kept
    full all along); the calls in flight then are waited for (so the next phase starts on
    an idle mesh) and count in `rows`, the divisor of CPU per row."""
    latencies: list[float] = []
    errors: list[str] = []
    done = {"rows": 0, "window_rows": 0, "window_calls": 0}
    order = itertools.count()
    deadline = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < deadline:
            texts = lists[next(order) % len(lists)]
            t0 = time.perf_counter()
            try:
                await call(texts)
            except Exception as exc:  # counted and shown: a refusal is a figure here
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                continue
            t1 = time.perf_counter()
            latencies.append(t1 - t0)
            done["rows"] += len(texts)
            if t1 <= deadline:
                done["window_rows"] += len(texts)
                done["window_calls"] += 1

    c0 = cpu.sample()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    used = cpu.usage(c0, cpu.sample(), len(latencies))
    return {
        "rows_per_s": done["window_rows"] / seconds,
        "requests_per_s": done["window_calls"] / seconds,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "rows": done["rows"],
        "wall_s": used["wall_s"],
        "client_cpu_s": used["cpu_s"],
    }


async def client_main(args: argparse.Namespace) -> int:
    """One phase as a client process: warm up, say `ready`, wait for `go`, run, print."""
    lists = make_lists(args.seed, args.lists, args.rows, args.mix)
    call, close = side(args.client, args.port)
    try:
        await asyncio.gather(*(call(lists[i % len(lists)]) for i in range(args.concurrency)))
        print("ready", flush=True)
        sys.stdin.readline()  # nothing else runs meanwhile: blocking the loop costs nothing
        result = await closed_loop(call, lists, args.concurrency, args.phase_s)
    finally:
        await close()
    print(json.dumps(result), flush=True)
    return 0


# --- the mesh and the phases -----------------------------------------------------------


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = cpu.process_cpu_s(pid)
        except OSError:  # gone (a crash): 0, its figure turns negative instead of ending the run
            out[name] = 0.0
    return out


def phase(name: str, ports: dict[str, int], pids: dict[str, int], args: argparse.Namespace) -> Any:
    argv = [sys.executable, __file__, "--client", name, "--port", str(ports[name])]
    for flag in ("phase_s", "concurrency", "seed", "lists", "rows", "mix"):
        argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{name} client did not start (its stderr is above)")
        before = cpu_now(pids)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        after = cpu_now(pids)
        if not line:
            raise RuntimeError(f"{name} client gave no result (its stderr is above)")
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:  # failed on the way: a client never outlives its phase
            proc.kill()
            proc.wait()
    result: dict[str, Any] = json.loads(line)
    per_k = 1000 / max(result["rows"], 1)
    spent = {n: (after[n] - before[n]) * per_k for n in pids}
    spent["mesh total"] = sum(spent.values())
    spent["client"] = result["client_cpu_s"] * per_k
    result["cpu_s_per_1000_rows"] = spent
    return result


async def same_vectors(ports: dict[str, int], lists: list[list[str]]) -> tuple[float, int]:
    """The lowest cosine between the two sides' vectors of every row of `lists`."""
    got = {}
    for name in SIDES:
        call, close = side(name, ports[name])
        try:
            got[name] = np.concatenate([await call(texts) for texts in lists])
        finally:
            await close()
    a, b = got["openai"], got["v2"]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min()), len(cos)


def med(rounds: list[dict[str, Any]], name: str, key: str, proc: str = "") -> float:
    return statistics.median(float(r[name][key][proc] if proc else r[name][key]) for r in rounds)


def report(rounds: list[dict[str, Any]], args: argparse.Namespace, check: tuple[float, int]) -> str:
    ratios = [r["openai"]["rows_per_s"] / r["v2"]["rows_per_s"] for r in rounds]
    figures = [("rows/s", "rows_per_s", 1), ("requests/s", "requests_per_s", 2)]
    figures += [("p50 ms", "p50_ms", 0), ("p99 ms", "p99_ms", 0)]
    rows = [[label, *(f"{med(rounds, s, key):.{d}f}" for s in SIDES)] for label, key, d in figures]
    rows.append(["errors (all rounds)", *(str(sum(r[s]["errors"] for r in rounds)) for s in SIDES)])
    for proc in rounds[0]["openai"]["cpu_s_per_1000_rows"]:
        cells = (f"{med(rounds, s, 'cpu_s_per_1000_rows', proc):.3f}" for s in SIDES)
        rows.append([f"CPU s / 1000 rows: {proc}", *cells])
    lines = [
        f"{len(rounds)} rounds of {args.phase_s:g} s phases, concurrency {args.concurrency}, "
        f"{args.rows}-text lists ({args.lists} distinct, mix {args.mix} %), model {MODEL}",
        f"vectors: lowest cosine openai vs v2 over {check[1]} rows {check[0]:.7f} "
        f"({'all' if check[0] >= 0.99999 else 'NOT all'} >= 0.99999)",
        "",
        *table(["figure (median over rounds)", *SIDES], rows),
        "",
        f"ratio openai / v2 rows/s: median of per-round ratios {statistics.median(ratios):.3f} "
        f"(rounds: {', '.join(f'{x:.3f}' for x in ratios)}); of the medians "
        f"{med(rounds, 'openai', 'rows_per_s') / med(rounds, 'v2', 'rows_per_s'):.3f}",
    ]
    for s in SIDES:
        firsts = {r[s]["first_error"] for r in rounds if r[s]["first_error"]}
        lines += [f"{s} first error: {e}" for e in sorted(firsts)]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    lists = make_lists(args.seed, args.lists, args.rows, args.mix)
    words = [len(t.split()) for texts in lists for t in texts]
    log(f"texts: words min {min(words)}, median {statistics.median(words)}, max {max(words)}")
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tiermesh-openai-v2-") as tmp:
        opts = UpOptions(
            port=free_port(),
            data_dir=Path(tmp) / "data",
            model_repository=REPO_ROOT / "models",
            http_port=0,
            metrics_port=0,
        )
        mesh = Mesh(opts)
        try:
            mesh.start()
            ports = {"openai": mesh.http_port, "v2": opts.port}
            pids = {s.name: s.proc.pid for s in mesh.services}
            pids["redis"] = mesh.redis.pid if mesh.redis is not None else 0
            log(f"mesh up: {ports}, processes {pids}")
            check = asyncio.run(same_vectors(ports, lists[:4]))
            warm = argparse.Namespace(**{**vars(args), "phase_s": args.warmup_s})
            for name in SIDES:
                figures = phase(name, ports, pids, warm)
                log(f"warm-up {name}: {figures['rows_per_s']:.0f} rows/s")
            for r in range(args.repeats):
                out: dict[str, Any] = {}
                for name in SIDES if r % 2 == 0 else SIDES[::-1]:
                    out[name] = phase(name, ports, pids, args)
                    log(
                        f"round {r + 1} {name}: {out[name]['rows_per_s']:.0f} rows/s, "
                        f"{out[name]['errors']} errors"
                    )
                rounds.append(out)
        finally:
            mesh.stop()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()
    print(f"openai_vs_v2 {time.strftime('%Y-%m-%d %H:%M')} commit {commit} (+ working tree)")
    print(report(rounds, args, check))
    if args.json:
        doc = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "rounds": rounds}
        args.json.write_text(json.dumps({**doc, "min_cosine": check[0]}, indent=1))
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--phase-s", type=float, default=15.0, help="seconds per phase")
    p.add_argument("--repeats", type=int, default=3, help="rounds (one phase per side each)")
    p.add_argument("--warmup-s", type=float, default=3.0, help="one discarded phase per side")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rows", type=int, default=32, help="texts per list")
    p.add_argument("--lists", type=int, default=64, help="distinct lists, sent in turn")
    p.add_argument(
        "--mix",
        default="70,25,5",
        help="per cent of texts of 4-16 / 17-35 / 36-60 words (default 70,25,5)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    # Internal: this script as one phase's client process.
    p.add_argument("--client", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return asyncio.run(client_main(args)) if args.client else run(args)


if __name__ == "__main__":
    raise SystemExit(main())
