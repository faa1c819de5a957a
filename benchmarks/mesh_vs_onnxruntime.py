"""The whole mesh against raw onnxruntime on the same model and the same inputs.

Starts a private mesh (`tiermesh up` in-process: redis-server, postprocess, router, worker,
gateway), then, in each of --repeats rounds, measures side by side:

- raw onnxruntime in this process, batch 1, one call after the other;
- raw onnxruntime at the model's max_batch_size (the best the batcher could reach);
- the mesh through tritonclient.grpc.aio, batch-1 requests at --concurrency;
- the mesh at concurrency 1.

Prints throughput and latency per case (median over the rounds), the ratios mesh/raw
(computed within each round, then the median), and the median of the per-request stage
times the mesh returns as response parameters. It asserts nothing: the numbers are for
reading. All traffic goes to 127.0.0.1 and is bounded in count and time.

    .venv/bin/python benchmarks/mesh_vs_onnxruntime.py [--requests N] [--concurrency C]
        [--repeats R] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tiermesh.bench.calls import values_of
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.settings import WorkerSettings
from tiermesh.up.processes import free_port
from tiermesh.up.supervisor import Mesh, UpOptions
from tiermesh.worker.runner import session_options

REPO_ROOT = Path(__file__).resolve().parents[1]
STAGES = (
    "preprocess_us",
    "queue_us",
    "batch_wait_us",
    "compute_us",
    "postprocess_us",
    "delivery_us",
    "batch_size",
)
# Client latency minus the sum of the stages: client <-> gateway hop, request decoding
# and response encoding in the gateway, tritonclient itself.
OUTSIDE = "outside_stages_us"
REQUEST_TIMEOUT_S = 10.0  # per mesh request
WARMUP_RAW_CALLS = 50

Floats = npt.NDArray[np.float32]


@dataclass
class CaseResult:
    """One case of one round: wall time of the whole case and each call's latency."""

    requests: int
    wall_s: float
    latencies_us: list[float]
    errors: int = 0
    first_error: str = ""
    timed_out: bool = False  # the case hit its time budget; the rest was not sent
    stages: dict[str, float] = field(default_factory=dict)  # medians over the requests
    max_abs_diff: float | None = None  # mesh outputs vs raw batch-1 outputs

    @property
    def throughput(self) -> float:
        return self.requests / self.wall_s if self.wall_s > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_us:
            return float("nan")
        return float(np.percentile(self.latencies_us, q)) / 1000.0

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "wall_s": self.wall_s,
            "throughput_rps": self.throughput,
            "p50_ms": self.percentile_ms(50),
            "p99_ms": self.percentile_ms(99),
            "errors": self.errors,
            "first_error": self.first_error,
            "timed_out": self.timed_out,
            "stages_median": self.stages,
            "max_abs_diff_vs_raw": self.max_abs_diff,
        }


# --- raw onnxruntime -------------------------------------------------------------------


def raw_session(model_path: Path) -> tuple[ort.InferenceSession, int]:
    """A session built exactly as the worker builds its own (same session options)."""
    threads = WorkerSettings().intra_op_threads
    session = ort.InferenceSession(
        str(model_path), session_options(threads), providers=["CPUExecutionProvider"]
    )
    return session, threads


def run_raw(
    session: ort.InferenceSession,
    input_name: str,
    output_name: str,
    inputs: Floats,
    batch: int,
) -> tuple[CaseResult, Floats]:
    """All inputs through the session in consecutive slices of `batch` rows. Latency is
    per session call (one call answers `batch` requests); throughput counts requests."""
    chunks = [inputs[i : i + batch] for i in range(0, len(inputs), batch)]
    outputs: list[Floats] = []
    latencies: list[float] = []
    start = time.perf_counter()
    for chunk in chunks:
        t0 = time.perf_counter()
        out = session.run([output_name], {input_name: chunk})[0]
        latencies.append((time.perf_counter() - t0) * 1e6)
        outputs.append(out)
    wall = time.perf_counter() - start
    return CaseResult(len(inputs), wall, latencies), np.concatenate(outputs)


# --- the mesh ------------------------------------------------------------------------


@dataclass
class MeshTarget:
    client: grpcaio.InferenceServerClient
    model: str
    input_name: str
    output_name: str
    requests: list[grpcaio.InferInput]  # one prepared batch-1 input per request


def prepare_requests(inputs: Floats, input_name: str) -> list[grpcaio.InferInput]:
    prepared = []
    for i in range(len(inputs)):
        inp = grpcaio.InferInput(input_name, [1, inputs.shape[1]], "FP32")
        inp.set_data_from_numpy(inputs[i : i + 1])
        prepared.append(inp)
    return prepared


async def run_mesh(
    target: MeshTarget, concurrency: int, budget_s: float, count: int = 0
) -> tuple[CaseResult, dict[int, tuple[float, Any]]]:
    """Send the prepared requests (or the first `count`) with `concurrency` callers in
    flight. Returns the case and, by request index, (latency_us, InferResult) of each
    answered request. Only the call and the clock run inside the timed loop."""
    requests = target.requests[:count] if count else target.requests
    indices = iter(range(len(requests)))
    answered: dict[int, tuple[float, Any]] = {}
    errors: list[str] = []

    async def caller() -> None:
        for i in indices:  # one iterator shared by every caller: each index is sent once
            t0 = time.perf_counter()
            try:
                res = await target.client.infer(
                    target.model, [requests[i]], client_timeout=REQUEST_TIMEOUT_S
                )
            except InferenceServerException as exc:
                errors.append(str(exc))
                continue
            answered[i] = ((time.perf_counter() - t0) * 1e6, res)

    start = time.perf_counter()
    timed_out = False
    try:
        async with asyncio.timeout(budget_s):
            await asyncio.gather(*(caller() for _ in range(min(concurrency, len(requests)))))
    except TimeoutError:
        timed_out = True  # keep what was answered; the unanswered count as errors
    wall = time.perf_counter() - start
    case = CaseResult(
        len(answered),
        wall,
        [lat for lat, _ in answered.values()],
        errors=len(requests) - len(answered),
        first_error=errors[0] if errors else ("case time budget ran out" if timed_out else ""),
        timed_out=timed_out,
    )
    return case, answered


def digest_mesh(
    case: CaseResult, answered: dict[int, tuple[float, Any]], output_name: str, reference: Floats
) -> None:
    """After the timed loop: the median of each stage parameter, the time outside the
    stages, and the largest difference between the mesh's outputs and raw batch 1."""
    per_stage: dict[str, list[float]] = {s: [] for s in (*STAGES, OUTSIDE)}
    diff = 0.0
    for i, (latency_us, res) in answered.items():
        params = values_of(res.get_response().parameters)
        inside = 0
        for stage in STAGES:
            if stage.endswith("_us"):  # returned as tiermesh.*_ms doubles
                key = stage.removesuffix("_us") + "_ms"
                if key in params:
                    value = round(params[key] * 1000)
                    per_stage[stage].append(value)
                    inside += value
            elif stage in params:
                per_stage[stage].append(int(params[stage]))
        per_stage[OUTSIDE].append(latency_us - inside)
        out = res.as_numpy(output_name)
        if out is not None:
            diff = max(diff, float(np.max(np.abs(out - reference[i : i + 1]))))
    case.max_abs_diff = diff if answered else None
    case.stages = {k: float(statistics.median(v)) for k, v in per_stage.items() if v}


# --- one run -------------------------------------------------------------------------


@dataclass
class Setup:
    cfg: ModelConfig
    session: ort.InferenceSession
    inputs: Floats
    reference: Floats  # raw batch-1 outputs, for the correctness check
    target: MeshTarget
    concurrency: int
    requests_c1: int
    budget_s: float


async def one_round(setup: Setup, reverse: bool) -> dict[str, CaseResult]:
    """The four cases once. Odd rounds run them in reverse so neither side always goes
    first (warm caches, a neighbour's load)."""
    inp, out = setup.target.input_name, setup.target.output_name
    order = ["raw_b1", "raw_bmax", "mesh_c", "mesh_c1"]
    if reverse:
        order.reverse()
    results: dict[str, CaseResult] = {}
    for key in order:
        if key.startswith("raw"):
            batch = 1 if key == "raw_b1" else setup.cfg.max_batch_size
            results[key] = run_raw(setup.session, inp, out, setup.inputs, batch)[0]
        else:
            conc, count = (setup.concurrency, 0) if key == "mesh_c" else (1, setup.requests_c1)
            case, answered = await run_mesh(setup.target, conc, setup.budget_s, count)
            digest_mesh(case, answered, out, setup.reference)
            results[key] = case
    return results


async def measure(
    setup: Setup, repeats: int, warmup: int, log: Callable[[str], None]
) -> list[dict[str, CaseResult]]:
    session, target = setup.session, setup.target
    for _ in range(WARMUP_RAW_CALLS):
        session.run([target.output_name], {target.input_name: setup.inputs[:1]})
    warm, _ = await run_mesh(target, setup.concurrency, setup.budget_s, warmup)
    if warm.errors:
        raise RuntimeError(f"mesh warm-up failed: {warm.errors} errors, e.g. {warm.first_error}")
    rounds = []
    for r in range(repeats):
        t0 = time.perf_counter()
        rounds.append(await one_round(setup, reverse=r % 2 == 1))
        log(f"round {r + 1}/{repeats} done in {time.perf_counter() - t0:.1f}s")
    return rounds


# --- report --------------------------------------------------------------------------

CASE_LABELS = {
    "raw_b1": "raw onnxruntime, batch 1, sequential",
    "raw_bmax": "raw onnxruntime, batch {bmax} (per call)",
    "mesh_c": "mesh, batch-1 requests, concurrency {c}",
    "mesh_c1": "mesh, batch-1 requests, concurrency 1 (*)",
}
RATIOS: list[tuple[str, str, str, str]] = [
    # label, numerator case, denominator case, metric
    ("throughput  mesh c{c} / raw batch 1", "mesh_c", "raw_b1", "throughput_rps"),
    ("throughput  mesh c{c} / raw batch {bmax}", "mesh_c", "raw_bmax", "throughput_rps"),
    ("throughput  mesh c1 / raw batch 1", "mesh_c1", "raw_b1", "throughput_rps"),
    ("p50 latency mesh c1 / raw batch 1", "mesh_c1", "raw_b1", "p50_ms"),
    ("p99 latency mesh c1 / raw batch 1", "mesh_c1", "raw_b1", "p99_ms"),
    ("p50 latency mesh c{c} / raw batch {bmax} call", "mesh_c", "raw_bmax", "p50_ms"),
]


def median_of(values: Sequence[float]) -> float:
    finite = [v for v in values if v == v]  # drop NaN
    return float(statistics.median(finite)) if finite else float("nan")


def summarize(rounds: list[dict[str, CaseResult]], concurrency: int, bmax: int) -> dict[str, Any]:
    fmt = {"c": concurrency, "bmax": bmax}
    per_round = [{k: c.summary() for k, c in rnd.items()} for rnd in rounds]
    cases: dict[str, Any] = {}
    for key, label in CASE_LABELS.items():
        rows = [rnd[key] for rnd in per_round]
        cases[key] = {
            "label": label.format(**fmt),
            "throughput_rps": median_of([r["throughput_rps"] for r in rows]),
            "p50_ms": median_of([r["p50_ms"] for r in rows]),
            "p99_ms": median_of([r["p99_ms"] for r in rows]),
            "errors": sum(r["errors"] for r in rows),
            "timed_out": any(r["timed_out"] for r in rows),
        }
        stages = {s for r in rows for s in r["stages_median"]}
        if stages:
            cases[key]["stages_median"] = {
                s: median_of([r["stages_median"].get(s, float("nan")) for r in rows])
                for s in (*STAGES, OUTSIDE)
                if s in stages
            }
            diffs = [r["max_abs_diff_vs_raw"] for r in rows if r["max_abs_diff_vs_raw"] is not None]
            cases[key]["max_abs_diff_vs_raw"] = max(diffs) if diffs else None
    ratios = {}
    for label, num, den, metric in RATIOS:
        each = [
            rnd[num][metric] / rnd[den][metric] if rnd[den][metric] else float("nan")
            for rnd in per_round
        ]
        ratios[label.format(**fmt)] = median_of(each)
    return {"cases": cases, "ratios": ratios, "rounds": per_round}


def render(summary: dict[str, Any], config: dict[str, Any]) -> str:
    cases, ratios = summary["cases"], summary["ratios"]
    lines = [
        f"model {config['model']}  requests {config['requests']}  repeats {config['repeats']}"
        f"  cpus {config['cpus']}  onnxruntime {config['onnxruntime']}"
        f"  intra_op_threads {config['intra_op_threads']} (0 = onnxruntime default)",
        "median over repeats",
        "",
        f"{'case':<46}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}",
    ]
    for case in cases.values():
        lines.append(
            f"{case['label']:<46}{case['throughput_rps']:>10.0f}{case['p50_ms']:>10.3f}"
            f"{case['p99_ms']:>10.3f}{case['errors']:>8}"
        )
    bmax = config["max_batch_size"]
    lines += [
        f"(*) the first {config['requests_c1']} of the {config['requests']} requests",
        f"raw batch {bmax}: latency is that of one call answering {bmax} requests",
    ]
    if any(c.get("timed_out") for c in cases.values()):
        lines.append(f"!! a mesh case ran out of its {config['case_budget_s']}s budget: see errors")
    lines += ["", "ratios (per round, then median)"]
    lines += [f"  {label:<46}{value:>12.4g}" for label, value in ratios.items()]
    mesh_cases = {k: v for k, v in cases.items() if "stages_median" in v}
    if mesh_cases:
        columns = {"mesh_c": f"c{config['concurrency']}", "mesh_c1": "c1"}
        head = "".join(f"{columns.get(k, k):>12}" for k in mesh_cases)
        lines += ["", f"{'mesh stage parameters, median per request':<48}{head}"]
        for stage in (*STAGES, OUTSIDE):
            name = stage if stage == OUTSIDE else f"tiermesh.{stage}"
            row = "".join(
                f"{c['stages_median'].get(stage, float('nan')):>12.0f}" for c in mesh_cases.values()
            )
            lines.append(f"  {name:<46}{row}")
        diffs = [c["max_abs_diff_vs_raw"] for c in mesh_cases.values()]
        diff = max((d for d in diffs if d is not None), default=None)
        lines.append(f"  max |mesh output - raw output|: {diff}")
    return "\n".join(lines)


def without_nan(value: Any) -> Any:
    """NaN (a case with no answers) as null, so the file is strict JSON."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_nan(v) for v in value]
    return value


# --- entry point ---------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--requests", type=int, default=1024, help="requests per case (N)")
    p.add_argument(
        "--requests-c1",
        type=int,
        default=100,
        help="requests of the mesh concurrency-1 case (at most N; it is the slow one)",
    )
    p.add_argument("--concurrency", type=int, default=32, help="mesh callers in flight (C)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; the median is reported")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("--model", default="mlp", help="a model of the repository (FP32 input)")
    p.add_argument("--model-repository", type=Path, default=REPO_ROOT / "models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=128, help="mesh requests before measuring")
    p.add_argument(
        "--case-budget-s", type=float, default=60.0, help="give up on a mesh case after this"
    )
    args = p.parse_args(argv)
    if min(args.requests, args.requests_c1, args.concurrency, args.repeats, args.warmup) < 1:
        p.error("--requests(-c1), --concurrency, --repeats and --warmup must be at least 1")
    args.requests_c1 = min(args.requests_c1, args.requests)
    return args


def load_model(repo_root: Path, name: str) -> tuple[ModelConfig, Path]:
    repo = ModelRepository(repo_root)
    repo.load()
    cfg = repo.get(name)
    if cfg is None:
        raise SystemExit(f"model {name!r} is not in {repo_root}")
    if len(cfg.inputs) != 1 or cfg.inputs[0].datatype != "FP32" or cfg.max_batch_size < 1:
        raise SystemExit(f"model {name!r}: this benchmark needs one FP32 input and batching")
    return cfg, repo.checked_file(name)


async def run(args: argparse.Namespace) -> int:
    def log(msg: str) -> None:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)

    cfg, model_path = load_model(args.model_repository, args.model)
    session, threads = raw_session(model_path)
    spec = cfg.inputs[0]
    rng = np.random.default_rng(args.seed)
    inputs: Floats = rng.standard_normal((args.requests, *spec.dims), dtype=np.float32)
    output_name = cfg.outputs[0].name
    reference = run_raw(session, spec.name, output_name, inputs, 1)[1]

    with tempfile.TemporaryDirectory(prefix="tiermesh-bench-") as data_dir:
        port = free_port()
        mesh = Mesh(
            UpOptions(
                port=port,
                data_dir=Path(data_dir),
                model_repository=args.model_repository.resolve(),
                grace_s=5.0,
                extra_env={"TIERMESH_LOG_LEVEL": "warning"},
            )
        )
        client = None
        try:
            t0 = time.perf_counter()
            log("starting the mesh...")
            mesh.start()
            log(f"mesh serving on 127.0.0.1:{port} after {time.perf_counter() - t0:.1f}s")
            client = grpcaio.InferenceServerClient(f"127.0.0.1:{port}")
            target = MeshTarget(
                client, cfg.name, spec.name, output_name, prepare_requests(inputs, spec.name)
            )
            setup = Setup(
                cfg,
                session,
                inputs,
                reference,
                target,
                args.concurrency,
                args.requests_c1,
                args.case_budget_s,
            )
            rounds = await measure(setup, args.repeats, args.warmup, log)
        finally:
            if client is not None:
                await client.close()
            codes = mesh.stop()
            log(f"mesh stopped {codes}")

    config = {
        "model": cfg.name,
        "max_batch_size": cfg.max_batch_size,
        "max_batch_wait_ms": cfg.max_batch_wait_ms,
        "requests": args.requests,
        "requests_c1": args.requests_c1,
        "case_budget_s": args.case_budget_s,
        "concurrency": args.concurrency,
        "repeats": args.repeats,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "onnxruntime": ort.__version__,
        "intra_op_threads": threads,
    }
    summary = summarize(rounds, args.concurrency, cfg.max_batch_size)
    print(render(summary, config))
    if args.json is not None:
        doc = without_nan({"config": config, **summary})
        args.json.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        log(f"wrote {args.json}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
