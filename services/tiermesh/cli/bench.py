"""`tiermesh bench`: argument parsing and wiring for the load generator (tiermesh.bench);
capture and replay in cli/bench_capture.py, the generate scenario's options in
cli/bench_generate.py."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tiermesh.cli.args import (
    Parser,
    Subcommands,
    add_variant_arg,
    http_url,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_ints,
    unit_interval,
)
from tiermesh.cli.bench_capture import (
    add_capture_parsers,
    cmd_capture,
    cmd_replay,
    cost_args,
    cost_parent,
    print_cost,
)
from tiermesh.cli.bench_generate import add_arrival_args, add_generate_parser, generation_plan
from tiermesh.cli.endpoint import GENERATIVE_MODEL, add_url_arg
from tiermesh.cli.errors import Interrupted, usage_errors

if TYPE_CHECKING:
    from tiermesh.bench.config import BenchConfig


def cmd_bench(args: argparse.Namespace) -> int:
    """A scenario against a running mesh, written to a report directory; or `compare`:
    exit 1 when B regressed against A. The options are checked before anything is sent
    (a bad one: exit 2); a mesh that cannot be benched is a runtime error (exit 1)."""
    from tiermesh.bench import markdown, session
    from tiermesh.bench.report import SUMMARY_MD

    if args.scenario == "capture":
        return cmd_capture(args)
    if args.scenario == "replay":
        return cmd_replay(args)
    if args.scenario == "compare":
        return _cmd_compare(args)
    with usage_errors():
        cfg = _bench_config(args)
    try:
        written = session.run(cfg)
    except KeyboardInterrupt:
        raise Interrupted("abandoned, no report written") from None
    o = written.report["overall"]
    print(
        f"{o['ok']}/{o['sent']} answered, {o['throughput_rps']:.1f}/s, "
        f"p50 {markdown.fmt(o['p50_ms'])} ms, p99 {markdown.fmt(o['p99_ms'])} ms, "
        f"error rate {o['error_rate']:.2%}"
    )
    print(markdown.console_generation(written.report), end="")
    print_cost(written.report)
    knee = (written.report.get("ladder") or {}).get("knee")
    if knee:
        print(f"knee: concurrency {knee['concurrency']}, {knee['throughput_rps']:.1f}/s")
    print(f"report: {written.out_dir / SUMMARY_MD}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    """0: no regression, 1: B regressed against A, 2: the reports cannot be compared."""
    from tiermesh.bench import compare
    from tiermesh.bench.report import load

    with usage_errors():
        a, b = load(Path(args.a)), load(Path(args.b))
    th = compare.Thresholds(
        args.throughput_drop, args.p99_rise, args.error_rise, args.min_ok, args.cost_rise
    )
    deltas = compare.compare(a, b, th)
    print(compare.render(args.a, args.b, deltas, compare.mismatches(a, b)), end="")
    return 1 if any(d.regression for d in deltas) else 0


def _bench_config(args: argparse.Namespace) -> BenchConfig:
    """The run's settings from the options; ValueError names a bad one."""
    from tiermesh.bench import config
    from tiermesh.bench.arrivals import BurstPlan
    from tiermesh.bench.genwork import GenerationPlan
    from tiermesh.bench.ladder import LadderPlan
    from tiermesh.bench.workload import DEFAULT_LENGTHS, DEFAULT_MIX, DEFAULT_PRIORITIES

    requests, duration_s = config.bounds_for(args.scenario, args.requests, args.duration_s)
    extra = vars(args)
    mesh_metrics, prices_file = cost_args(args)
    concurrency = extra.get("concurrency")
    return config.BenchConfig(
        scenario=args.scenario,
        out_dir=Path(args.out) if args.out else config.default_out_dir(args.scenario),
        url=args.url,
        model=args.model,
        seed=args.seed,
        mix=args.mix or DEFAULT_MIX,
        priorities=args.priorities or DEFAULT_PRIORITIES,
        lengths=args.lengths or dict(DEFAULT_LENGTHS),
        requests=requests,
        duration_s=duration_s,
        timeout_s=config.timeout_for(args.scenario, args.timeout_s),
        concurrency=8 if concurrency is None else concurrency,
        warmup=args.warmup,
        variant=args.variant,
        ladder=LadderPlan(
            concurrencies=tuple(args.steps),
            step_requests=args.step_requests,
            step_duration_s=args.step_duration_s,
            slo_ms=args.slo_ms,
            min_gain=args.min_gain,
            patience=args.patience,
            max_error_rate=args.max_error_rate,
        )
        if args.scenario == "ladder"
        else LadderPlan(),
        burst=BurstPlan(
            args.rate,
            args.spike_rate,
            args.spike_every_s,
            args.spike_len_s,
            poisson=args.arrivals == "poisson",
        )
        if args.scenario == "burst"
        else BurstPlan(rate_rps=50.0),
        max_in_flight=extra.get("max_in_flight", 1024),
        metrics_url=args.metrics_url,
        metrics_interval_s=args.metrics_interval_s,
        window_s=args.window_s,
        progress=not args.no_progress,
        mesh_metrics=mesh_metrics,
        prices_file=prices_file,
        generation=generation_plan(args) if args.scenario == "generate" else GenerationPlan(),
    )


def typed(parse: Any) -> Any:
    """An argparse type from a parse_* function of tiermesh.bench (ValueError: refused)."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


def common_parent(model: str) -> Parser:
    """The options of every scenario that sends load; `model`: the --model default."""
    from tiermesh.bench.workload import parse_lengths, parse_mix, parse_priorities

    common = Parser(add_help=False)
    g = common.add_argument_group("target and workload")
    add_url_arg(g)
    g.add_argument("--model", default=model, help="the model to load")
    add_variant_arg(g)
    g.add_argument("--seed", type=int, default=0, help="workload seed")
    g.add_argument(
        "--mix",
        type=typed(parse_mix),
        default=None,
        help="length shares for text models (default: short=0.7,medium=0.25,long=0.05)",
    )
    g.add_argument(
        "--priorities",
        type=typed(parse_priorities),
        default=None,
        help="priority shares, e.g. 1=0.2,2=0.8 (default: 0=1, the model's default)",
    )
    g.add_argument(
        "--lengths",
        type=typed(parse_lengths),
        default=None,
        help="words per length class (default: short=6-12,medium=38-58,long=100-120)",
    )
    g = common.add_argument_group("bounds")
    g.add_argument(
        "--requests",
        type=int,
        default=None,
        help="at most this many (default: per scenario, e.g. steady 2000)",
    )
    g.add_argument(
        "--duration-s",
        type=float,
        default=None,
        help="at most this long (default: per scenario, e.g. steady 60)",
    )
    g.add_argument(
        "--timeout-s", type=float, default=None, help="per request (default: 10; generate: 120)"
    )
    g.add_argument("--warmup", type=int, default=10, help="unrecorded requests first")
    g = common.add_argument_group("report")
    g.add_argument(
        "--out", default=None, help="report directory (default: bench-reports/<time>-<scenario>)"
    )
    g.add_argument("--window-s", type=float, default=1.0, help="time-series window, seconds")
    g.add_argument(
        "--metrics-url",
        type=http_url,
        default="",
        help="Prometheus endpoint to sample tiermesh_queue_depth from, e.g. "
        "http://127.0.0.1:8002/metrics (default: the client's in-flight count)",
    )
    g.add_argument(
        "--metrics-interval-s", type=float, default=0.5, help="--metrics-url sampling, seconds"
    )
    common.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (off anyway when stderr is no terminal)",
    )
    return Parser(add_help=False, parents=[common, cost_parent()])


def add_bench_parser(sub: Subcommands) -> None:
    from tiermesh.bench.ladder import DEFAULT_STEPS

    bench = sub.add_parser(
        "bench",
        help="load a running mesh; reports, plots and comparisons",
        description="Send seeded load to a running mesh (tritonclient gRPC) and write a report\n"
        "directory: report.json, summary.md and PNG plots. Each scenario is bounded by\n"
        "--requests and --duration-s, whichever comes first. Ctrl-C stops sending and still\n"
        "writes the report (twice: abandons it). `SCENARIO --help` lists its options.",
        epilog="examples:\n"
        "  tiermesh bench steady --model minilm-l6 --concurrency 16 --requests 2000\n"
        "  tiermesh bench ladder --model minilm-l3 --slo-ms 200 --priorities 1=0.2,2=0.8\n"
        "  tiermesh bench burst --model mlp --rate 100 --spike-rate 800 --duration-s 60\n"
        "  tiermesh bench generate --concurrency 4 --max-new-tokens 16-128\n"
        "  tiermesh bench compare bench-reports/A bench-reports/B   # exit 1: regression",
    )
    common = common_parent("mlp")
    closed = Parser(add_help=False)
    closed.add_argument("--concurrency", type=int, default=8, help="callers in a closed loop")

    kinds = bench.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    kinds.add_parser("single", parents=[common], help="one request at a time (200 requests / 60 s)")
    kinds.add_parser(
        "steady", parents=[common, closed], help="closed loop at --concurrency (2000 / 60 s)"
    )
    kinds.add_parser("soak", parents=[common, closed], help="closed loop for a fixed time (300 s)")
    lad = kinds.add_parser("ladder", parents=[common], help="concurrency stepped up to the knee")
    g = lad.add_argument_group("ladder")
    g.add_argument(
        "--steps",
        type=positive_ints,
        default=list(DEFAULT_STEPS),
        help="concurrencies, rising (default: 1,2,4,...,256)",
    )
    g.add_argument("--step-requests", type=int, default=400, help="at most this many per step")
    g.add_argument("--step-duration-s", type=float, default=10.0, help="at most this long per step")
    g.add_argument(
        "--slo-ms",
        type=positive_float,
        default=None,
        help="stop when a step's p99 passes this (default: none)",
    )
    g.add_argument(
        "--min-gain", type=nonneg_float, default=0.05, help="relative throughput gain that counts"
    )
    g.add_argument("--patience", type=int, default=2, help="steps under --min-gain before stopping")
    g.add_argument(
        "--max-error-rate", type=unit_interval, default=0.01, help="stop above this share"
    )
    burst = kinds.add_parser(
        "burst", parents=[common], help="open-loop arrivals with periodic spikes"
    )
    g = burst.add_argument_group("arrivals")
    g.add_argument("--rate", type=float, default=50.0, help="base arrivals / s")
    g.add_argument("--spike-rate", type=float, default=200.0, help="arrivals / s in a spike")
    g.add_argument(
        "--spike-every-s", type=float, default=10.0, help="seconds between spikes (0: none)"
    )
    g.add_argument("--spike-len-s", type=float, default=2.0, help="a spike's length, seconds")
    add_arrival_args(g)
    add_generate_parser(kinds, common_parent(GENERATIVE_MODEL), typed)
    add_capture_parsers(kinds, cost_parent())
    cmp = kinds.add_parser(
        "compare",
        help="differences between two report directories",
        description="Exit status: 0 no regression, 1 B regressed against A, 2 the reports "
        "cannot be compared (or a usage error).",
    )
    cmp.add_argument("a", help="the baseline report directory")
    cmp.add_argument("b", help="the report to judge against it")
    g = cmp.add_argument_group("thresholds")
    g.add_argument(
        "--throughput-drop", type=nonneg_float, default=0.10, help="flag a larger relative drop"
    )
    g.add_argument(
        "--p99-rise", type=nonneg_float, default=0.10, help="flag a larger relative rise"
    )
    g.add_argument(
        "--error-rise", type=nonneg_float, default=0.01, help="flag a larger absolute rise"
    )
    g.add_argument(
        "--cost-rise",
        type=nonneg_float,
        default=0.10,
        help="flag a larger relative rise of cost per request or token",
    )
    g.add_argument(
        "--min-ok",
        type=nonneg_int,
        default=20,
        help="groups answered fewer times are not flagged",
    )
    bench.set_defaults(func=cmd_bench)
