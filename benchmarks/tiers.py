"""Where requests should run: tiered placement against all-center and all-edge, with and
without a slow link between the edge tier and the center.

Three placements of one text model (default minilm-l3), each a private mesh (own
redis-server, data dir and temporary model repository linking the committed weights):

- tiered:     the committed config: light requests (rows x tokens <= the edge's max_cost)
              to the edge worker (--edge-threads), the rest to center, both FP32.
- all-center: the committed config, but only the center worker is started; the router
              avoids the dead edge tier, so center serves everything (FP32).
- all-edge:   both workers started, the config's tiers replaced by
              `edge: {max_cost: 0}` (its variant kept): the edge worker serves everything.

tiered and all-edge run once per --link-ms value (the round trip `tiermesh up
--edge-link-ms` adds between the edge worker and redis/postprocess). all-center has no
edge worker, so the link changes nothing there: it runs once and is shown under every link.

Workload: seeded texts, 70% light (8-14 tokens), 25% medium (40-60), 5% long (110-125;
200-250 for a model whose tokenizer takes 256), one text per request, --concurrency callers
in a closed loop after a warm-up. Every mesh is up for the whole run and the meshes are
measured one after the other within each round (the order rotates between rounds).
Medians over rounds; ratios are taken within a round, then the median.

Prints a table; asserts nothing. All traffic goes to 127.0.0.1, bounded in count and time.
Progress and the children's output go to stderr.

    .venv/bin/python benchmarks/tiers.py [--model minilm-l3] [--requests N]
        [--concurrency C] [--repeats R] [--link-ms 0,20] [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio
import yaml
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from tiermesh.bench.calls import values_of
from tiermesh.bench.workload import TokenText, counting_tokenizer, mixed_texts
from tiermesh.core.model_files import mirror_model
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions

REPO_ROOT = Path(__file__).resolve().parents[1]
MIX = (("light", 0.70, (8, 14)), ("medium", 0.25, (40, 60)), ("long", 0.05, (110, 125)))
PLACEMENTS = ("tiered", "all-center", "all-edge")
TIERS = ("edge", "center")
REQUEST_TIMEOUT_S = 20.0


@dataclass
class Case:
    name: str  # e.g. "tiered @ 20 ms"
    placement: str
    link_ms: float
    mesh: Mesh
    client: grpcaio.InferenceServerClient | None = None


@dataclass
class Answer:
    latency_ms: float
    kind: str
    tier: str
    variant: str


@dataclass
class Run:
    wall_s: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


# --- workload ------------------------------------------------------------------------


def make_texts(
    tok: Tokenizer, rng: np.random.Generator, n: int, long: tuple[int, int]
) -> list[TokenText]:
    """`n` texts in the exact MIX proportions, the long class at `long` tokens."""
    return mixed_texts(tok, rng, n, [(k, sh, long if k == "long" else span) for k, sh, span in MIX])


def infer_input(text: bytes) -> grpcaio.InferInput:
    inp = grpcaio.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    return inp


# --- meshes --------------------------------------------------------------------------


def edge_takes_all(raw: dict[str, Any]) -> None:
    """The all-edge placement's config: the edge tier takes every request."""
    edge = (raw.get("tiers") or {}).get("edge") or {}
    raw["tiers"] = {"edge": {"variant": edge.get("variant", ""), "max_cost": 0}}


def plan_cases(
    tmp: Path, model_dir: Path, links: Sequence[float], args: argparse.Namespace
) -> list[Case]:
    cases: list[Case] = []
    repos = {
        name: mirror_model(
            model_dir, tmp / "repos" / name, edge_takes_all if name == "all-edge" else None
        )
        for name in ("tiered", "all-edge")
    }
    for placement in PLACEMENTS:
        for link in links[:1] if placement == "all-center" else links:
            name = placement if placement == "all-center" else f"{placement} @ {link:g} ms"
            port = free_port()
            opts = UpOptions(
                port=port,
                data_dir=tmp / "data" / f"{len(cases)}",
                model_repository=repos["all-edge" if placement == "all-edge" else "tiered"],
                metrics_port=0,
                grace_s=5.0,
                tiers=("center",) if placement == "all-center" else ("center", "edge"),
                edge_threads=args.edge_threads,
                edge_link_ms=link,
                extra_env={"TIERMESH_LOG_LEVEL": "warning"},
            )
            cases.append(Case(name, placement, link, Mesh(opts)))
    return cases


# --- load ----------------------------------------------------------------------------


def param_str(res: Any, key: str) -> str:
    return str(values_of(res.get_response().parameters).get(key, "?"))


async def closed_loop(
    client: grpcaio.InferenceServerClient,
    model: str,
    texts: Sequence[TokenText],
    concurrency: int,
    budget_s: float,
) -> Run:
    """Every text once, `concurrency` callers each sending its next when the last is
    answered; stops at the time budget (the rest counts as not answered)."""
    inputs = [infer_input(t.text) for t in texts]
    indices = iter(range(len(texts)))
    run = Run()

    async def caller() -> None:
        for i in indices:  # shared iterator: each text is sent once
            t0 = time.perf_counter()
            try:
                res = await client.infer(model, [inputs[i]], client_timeout=REQUEST_TIMEOUT_S)
            except InferenceServerException as exc:
                run.failures[str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")] += 1
                continue
            latency = (time.perf_counter() - t0) * 1000
            run.answers.append(
                Answer(latency, texts[i].kind, param_str(res, "tier"), param_str(res, "variant"))
            )

    start = time.perf_counter()
    try:
        async with asyncio.timeout(budget_s):
            await asyncio.gather(*(caller() for _ in range(min(concurrency, len(texts)))))
    except TimeoutError:
        pass
    run.wall_s = time.perf_counter() - start
    unanswered = len(texts) - len(run.answers) - sum(run.failures.values())
    if unanswered:
        run.failures["not answered in budget"] += unanswered
    return run


# --- figures -------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def figures(run: Run) -> dict[str, Any]:
    ans = run.answers
    light = [a.latency_ms for a in ans if a.kind == "light"]
    return {
        "answered": len(ans),
        "failures": dict(run.failures),
        "wall_s": run.wall_s,
        "throughput_rps": len(ans) / run.wall_s if run.wall_s > 0 else 0.0,
        "light_p50_ms": pct(light, 50),
        "light_p99_ms": pct(light, 99),
        "p50_ms": pct([a.latency_ms for a in ans], 50),
        "p99_ms": pct([a.latency_ms for a in ans], 99),
        "served": dict(Counter(f"{a.tier}/{a.variant}" for a in ans)),
        "served_by_kind": {
            kind: dict(Counter(a.tier for a in ans if a.kind == kind)) for kind, _, _ in MIX
        },
    }


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(statistics.median(finite)) if finite else math.nan


def summarize(cases: Sequence[Case], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("throughput_rps", "light_p50_ms", "light_p99_ms", "p50_ms", "p99_ms")
    out: dict[str, Any] = {}
    for case in cases:
        rows = [r[case.name] for r in rounds]
        served: Counter[str] = Counter()
        by_kind: dict[str, Counter[str]] = {kind: Counter() for kind, _, _ in MIX}
        for row in rows:
            served.update(row["served"])
            for kind, tiers in row["served_by_kind"].items():
                by_kind[kind].update(tiers)
        total = sum(served.values())
        out[case.name] = {
            "placement": case.placement,
            "link_ms": None if case.placement == "all-center" else case.link_ms,
            **{k: median_of([row[k] for row in rows]) for k in keys},
            "throughput_vs_center": median_of(
                [r["throughput_vs_center"][case.name] for r in rounds]
            ),
            "share": {
                tier: sum(n for k, n in served.items() if k.startswith(f"{tier}/")) / total
                if total
                else math.nan
                for tier in TIERS
            },
            "served": dict(served),
            "served_by_kind": {k: dict(v) for k, v in by_kind.items()},
            "failures": sum(sum(row["failures"].values()) for row in rows),
        }
    return out


def render(summary: dict[str, Any], config: dict[str, Any], links: Sequence[float]) -> str:
    lines = [
        f"model {config['model']}  requests {config['requests']}/case/round  concurrency"
        f" {config['concurrency']}  repeats {config['repeats']}  edge threads"
        f" {config['edge_threads']}  cpus {config['cpus']}",
        f"mix: {config['mix']}",
        "median over rounds; req/s ratio vs all-center taken per round",
        "",
        f"  {'link':>7}  {'placement':<11}{'req/s':>7}{'x center':>10}{'light p50':>11}"
        f"{'light p99':>11}{'all p99':>9}{'edge':>7}{'center':>8}{'failed':>8}",
    ]
    for link in links:
        for placement in PLACEMENTS:
            name = placement if placement == "all-center" else f"{placement} @ {link:g} ms"
            c = summary[name]
            label = f"{link:g} ms" + ("*" if placement == "all-center" else "")
            lines.append(
                f"  {label:>7}  {placement:<11}{c['throughput_rps']:>7.1f}"
                f"{c['throughput_vs_center']:>10.2f}{c['light_p50_ms']:>11.1f}"
                f"{c['light_p99_ms']:>11.1f}{c['p99_ms']:>9.1f}"
                f"{c['share']['edge']:>7.0%}{c['share']['center']:>8.0%}{c['failures']:>8}"
            )
    lines += [
        "",
        "  link = round trip added between the edge worker and redis/postprocess",
        "  * all-center has no edge worker: one mesh, measured once per round, shown per link",
        "  light = 8-14 token requests; latencies in ms at the client;"
        " edge/center = share of answers by the `tier` response parameter",
    ]
    for name, c in summary.items():
        kinds = ", ".join(
            f"{k} " + "/".join(f"{t} {n}" for t, n in sorted(v.items()))
            for k, v in c["served_by_kind"].items()
            if v
        )
        lines.append(f"  {name:<16} served by tier, all rounds: {kinds}")
    return "\n".join(lines)


def without_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


# --- the run -------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> int:
    model_dir = REPO_ROOT / "models" / args.model
    raw = yaml.safe_load((model_dir / "config.yaml").read_text())
    max_length = int(raw["tokenize"]["max_length"])
    long = (200, 250) if max_length >= 250 else (110, min(125, max_length))
    tok = counting_tokenizer(model_dir)
    rng = np.random.default_rng(args.seed)
    texts = make_texts(tok, rng, args.requests, long)
    warmup = make_texts(tok, rng, args.warmup, long)
    links = [float(x) for x in args.link_ms.split(",") if x.strip()]
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tiermesh-tiers-") as tmp:
        cases = plan_cases(Path(tmp), model_dir, links, args)
        try:
            for case in cases:
                started = time.perf_counter()
                case.mesh.start()
                case.client = grpcaio.InferenceServerClient(f"127.0.0.1:{case.mesh.opts.port}")
                log(f"{case.name}: mesh up in {time.perf_counter() - started:.1f}s")
            for case in cases:
                assert case.client is not None
                warm = await closed_loop(
                    case.client, args.model, warmup, args.concurrency, args.budget_s
                )
                if warm.failures:
                    raise RuntimeError(f"{case.name} warm-up failed: {dict(warm.failures)}")
            for r in range(args.repeats):
                shift = r % len(cases)
                rnd: dict[str, Any] = {}
                for case in cases[shift:] + cases[:shift]:
                    assert case.client is not None
                    result = await closed_loop(
                        case.client, args.model, texts, args.concurrency, args.budget_s
                    )
                    rnd[case.name] = figures(result)
                center = rnd["all-center"]["throughput_rps"]
                rnd["throughput_vs_center"] = {
                    c.name: rnd[c.name]["throughput_rps"] / center if center else math.nan
                    for c in cases
                }
                rounds.append(rnd)
                log(
                    f"round {r + 1}/{args.repeats}: "
                    + ", ".join(f"{c.name} {rnd[c.name]['throughput_rps']:.0f}" for c in cases)
                    + " req/s"
                )
        finally:
            for case in cases:
                if case.client is not None:
                    await case.client.close()
                if case.mesh.services or case.mesh.redis is not None:
                    log(f"{case.name}: stopped {case.mesh.stop()}")
    kinds = Counter(t.kind for t in texts)
    tokens = {k: [t.tokens for t in texts if t.kind == k] for k in kinds}
    config = {
        "model": args.model,
        "requests": args.requests,
        "warmup": args.warmup,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "edge_threads": args.edge_threads,
        "link_ms": links,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "mix": ", ".join(
            f"{k} {kinds[k]} ({min(tokens[k])}-{max(tokens[k])} tokens)"
            for k, _, _ in MIX
            if k in kinds
        ),
    }
    summary = summarize(cases, rounds)
    print(render(summary, config, links))
    if args.json is not None:
        doc = {"config": config, "cases": summary, "rounds": rounds}
        args.json.write_text(json.dumps(without_nan(doc), indent=2, allow_nan=False) + "\n")
        log(f"wrote {args.json}")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--model", default="minilm-l3", help="a text model of models/ with tiers")
    p.add_argument("--requests", type=int, help="requests per case and round (400)")
    p.add_argument("--warmup", type=int, help="requests per case before measuring (64)")
    p.add_argument("--concurrency", type=int, default=16, help="closed-loop callers (16)")
    p.add_argument("--repeats", type=int, help="rounds; medians are reported (3)")
    p.add_argument("--link-ms", default="0,20", help="edge link round trips, ms (0,20)")
    p.add_argument("--edge-threads", type=int, default=1, help="edge worker's threads (1)")
    p.add_argument("--budget-s", type=float, default=60.0, help="cap of one closed-loop run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--quick", action="store_true", help="a short run (~1 min)")
    args = p.parse_args(argv)
    defaults = {
        "requests": 200 if args.quick else 400,
        "warmup": 32 if args.quick else 64,
        "repeats": 2 if args.quick else 3,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.requests, args.warmup, args.concurrency, args.repeats) < 1:
        p.error("--requests, --warmup, --concurrency, --repeats must be >= 1")
    if not (REPO_ROOT / "models" / args.model / "config.yaml").is_file():
        p.error(f"no model {args.model!r} in {REPO_ROOT / 'models'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
