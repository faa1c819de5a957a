"""What a refusal costs the mesh: CPU per refused call in the front door and the gateway,
and how long a caller waits for one (issue 23: "a refused request must cost well under a
tenth of a served one").

`tiermesh up` with its defaults serves the bundled mlp, but for one call in flight at a
time (TIERMESH_MAX_IN_FLIGHT=1): the compiled load generator (tiermesh.bench.goload) keeps
`--callers` closed-loop callers sending for `--seconds`, `--rounds` times, and all but one
of them are refused at once. Each round reads the door's and the gateway's CPU seconds from
/proc before and after; the figure is the median over rounds of (CPU seconds / calls
refused), in microseconds. The few served calls are counted in it too (printed beside: a
served call of the mlp costs the door ~110 us and the gateway ~100 us, mesh_vs_raw.py),
the same share in every build.

    .venv/bin/python benchmarks/refusal_cost.py [--rounds 5] [--seconds 5] [--callers 64]

Run it from two checkouts (`git worktree add`) to compare builds: the door is built from
the checkout's own Go sources.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import tritonclient.grpc.aio as grpcaio

from tiermesh.bench.calls import model_inputs
from tiermesh.bench.cpu import process_cpu_s
from tiermesh.bench.goload import LoadConfig, infer_request, run_load
from tiermesh.bench.stats import percentile
from tiermesh.bench.workload import Workload
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

MODEL = "mlp"
DEADLINE_MS = 1000.0
REFUSED = "RESOURCE_EXHAUSTED"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def rounds(mesh: Mesh, url: str, args: argparse.Namespace) -> list[dict[str, float]]:
    client = grpcaio.InferenceServerClient(url)
    try:
        workload = Workload(await model_inputs(client, MODEL), seed=3)
    finally:
        await client.close()
    requests = tuple(infer_request(MODEL, next(workload)) for _ in range(64))
    pids = {s.name: s.proc.pid for s in mesh.services}
    door, gateway = pids["frontdoor"], pids["gateway"]
    config = LoadConfig(
        url,
        requests,
        args.seconds,
        DEADLINE_MS,
        mode="closed",
        concurrency=args.callers,
        connections=4,
    )
    await run_load(default_cache_dir(), config)  # unmeasured: connections, the door's pools
    before = process_cpu_s(door), process_cpu_s(gateway)
    await asyncio.sleep(args.seconds)
    after = process_cpu_s(door), process_cpu_s(gateway)
    log(
        f"idle: door {(after[0] - before[0]) / args.seconds:.1%}, gateway "
        f"{(after[1] - before[1]) / args.seconds:.1%} of a core"
    )
    out = []
    for r in range(args.rounds):
        before = process_cpu_s(door), process_cpu_s(gateway)
        run = await run_load(default_cache_dir(), config)
        after = process_cpu_s(door), process_cpu_s(gateway)
        refused = [x.outcome.latency_ms for x in run.records if x.outcome.code == REFUSED]
        others = Counter(x.outcome.code for x in run.records if x.outcome.code != REFUSED)
        n = max(len(refused), 1)
        row = {
            "door_us": (after[0] - before[0]) / n * 1e6,
            "gateway_us": (after[1] - before[1]) / n * 1e6,
            "refused_per_s": len(refused) / run.wall_s,
            "served_share": others.get("OK", 0) / max(len(run.records), 1),
            "p50_ms": percentile(refused, 50),
            "p99_ms": percentile(refused, 99),
        }
        log(
            f"round {r + 1}: {len(refused)} refused ({row['refused_per_s']:.0f}/s), "
            f"others {dict(others)}; door {row['door_us']:.1f} us, gateway "
            f"{row['gateway_us']:.1f} us a refusal; latency p50 {row['p50_ms']:.2f} p99 "
            f"{row['p99_ms']:.2f} ms"
        )
        out.append(row)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--callers", type=int, default=64)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.seconds <= 0 or args.callers < 1:
        p.error("--rounds and --callers must be >= 1, --seconds > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="refusal-cost-") as tmp:
        port = free_port()
        mesh = Mesh(
            UpOptions(
                port=port,
                data_dir=Path(tmp) / "data",
                http_port=0,
                metrics_port=0,
                grace_s=2.0,
                extra_env={"TIERMESH_MAX_IN_FLIGHT": "1"},
            )
        )
        mesh.start()
        try:
            rows = asyncio.run(rounds(mesh, f"127.0.0.1:{port}", args))
        finally:
            mesh.stop()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(
        f"{MODEL}, {args.callers} closed-loop callers, one call in flight, medians of "
        f"{len(rows)} rounds of {args.seconds:g} s:\n"
        f"refused per second:       {med('refused_per_s'):10.0f}"
        f" (and {med('served_share'):.1%} of the calls served)\n"
        f"front door CPU a refusal: {med('door_us'):10.1f} us\n"
        f"gateway CPU a refusal:    {med('gateway_us'):10.1f} us\n"
        f"refusal latency p50/p99:  {med('p50_ms'):6.2f} / {med('p99_ms'):.2f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
