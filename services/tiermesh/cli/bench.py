"""`tiermesh bench`: argument parsing and wiring for the load generator (tiermesh.bench)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tiermesh.cli.bench_generate import add_arrival_args, add_generate_parser, generation_plan


def cmd_bench(args: argparse.Namespace) -> int:
    """A scenario against a running mesh, written to a report directory; or `compare`:
    exit 1 when B regressed against A."""
    from tiermesh.bench import compare, config, markdown, session
    from tiermesh.bench.arrivals import BurstPlan
    from tiermesh.bench.calls import BenchError
    from tiermesh.bench.genwork import GenerationPlan
    from tiermesh.bench.ladder import LadderPlan
    from tiermesh.bench.report import SUMMARY_MD, load
    from tiermesh.bench.workload import DEFAULT_LENGTHS, DEFAULT_MIX, DEFAULT_PRIORITIES

    if args.scenario == "capture":
        return _cmd_capture(args)
    if args.scenario == "replay":
        return _cmd_replay(args)
    if args.scenario == "compare":
        try:
            a, b = load(Path(args.a)), load(Path(args.b))
        except ValueError as exc:
            print(f"tiermesh bench compare: {exc}", file=sys.stderr)
            return 2
        th = compare.Thresholds(
            args.throughput_drop, args.p99_rise, args.error_rise, args.min_ok, args.cost_rise
        )
        deltas = compare.compare(a, b, th)
        print(compare.render(args.a, args.b, deltas, compare.mismatches(a, b)), end="")
        return 1 if any(d.regression for d in deltas) else 0
    requests, duration_s = config.bounds_for(args.scenario, args.requests, args.duration_s)
    extra = vars(args)
    try:
        mesh_metrics, prices_file = _cost_args(args)
        concurrency = extra.get("concurrency")
        cfg = config.BenchConfig(
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
        written = session.run(cfg)
    except (ValueError, BenchError) as exc:
        print(f"tiermesh bench: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tiermesh bench: abandoned, no report written", file=sys.stderr)
        return 130
    o = written.report["overall"]
    print(
        f"{o['ok']}/{o['sent']} answered, {o['throughput_rps']:.1f}/s, "
        f"p50 {markdown.fmt(o['p50_ms'])} ms, p99 {markdown.fmt(o['p99_ms'])} ms, "
        f"error rate {o['error_rate']:.2%}"
    )
    print(markdown.console_generation(written.report), end="")
    _print_cost(written.report)
    knee = (written.report.get("ladder") or {}).get("knee")
    if knee:
        print(f"knee: concurrency {knee['concurrency']}, {knee['throughput_rps']:.1f}/s")
    print(f"report: {written.out_dir / SUMMARY_MD}")
    return 0


def _cmd_capture(args: argparse.Namespace) -> int:
    """`capture start|stop|release|clear|export|key` against the mesh's Redis."""
    import redis

    from tiermesh.bench import capture

    if args.action == "key":
        print(capture.new_key())
        return 0
    client = redis.Redis.from_url(args.redis_url, socket_timeout=10)
    try:
        if args.action == "start":
            capture.start(client, args.rate, args.window_s)
            until = f"for {args.window_s:g} s" if args.window_s > 0 else "until stopped"
            print(f"capturing {args.rate:.0%} of requests {until}")
        elif args.action == "stop":
            capture.stop(client)
            print("capture stopped")
        elif args.action == "release":
            capture.release(client)
            print("capture follows each gateway's settings again")
        elif args.action == "clear":
            print(f"{capture.clear(client)} captured records deleted")
        else:
            n = capture.export(client, Path(args.out))
            print(f"{n} records written to {args.out}")
    except (redis.RedisError, OSError, ValueError) as exc:
        print(f"tiermesh bench capture: {exc}", file=sys.stderr)
        return 2
    finally:
        client.close()
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    """Drive the mesh with a capture's arrivals and sizes; write the bench report."""
    import asyncio

    from tiermesh.bench import config, replay, session
    from tiermesh.bench.report import SUMMARY_MD

    try:
        mesh_metrics, prices_file = _cost_args(args)
        cfg = replay.ReplayConfig(
            capture=Path(args.capture),
            out_dir=Path(args.out) if args.out else config.default_out_dir("replay"),
            url=args.url,
            model=args.model,
            speed=args.speed,
            seed=args.seed,
            timeout_s=args.timeout_s,
            max_in_flight=args.max_in_flight,
            window_s=args.window_s,
            mesh_metrics=mesh_metrics,
            prices_file=prices_file,
        )
        written = session.write(asyncio.run(replay.measure(cfg)), cfg.out_dir)
    except ValueError as exc:
        print(f"tiermesh bench replay: {exc}", file=sys.stderr)
        return 2
    o = written.report["overall"]
    print(
        f"{o['ok']}/{o['sent']} answered, {o['throughput_rps']:.1f}/s, "
        f"p50 {markdown_fmt(o['p50_ms'])} ms, p99 {markdown_fmt(o['p99_ms'])} ms, "
        f"error rate {o['error_rate']:.2%}"
    )
    _print_cost(written.report)
    print(f"report: {written.out_dir / SUMMARY_MD}")
    return 0


def markdown_fmt(value: Any) -> str:
    from tiermesh.bench import markdown

    return markdown.fmt(value)


def _add_capture_parsers(kinds: Any, common_cost: argparse.ArgumentParser) -> None:
    import os

    cap = kinds.add_parser(
        "capture",
        help="record live traffic shapes at the gateways; export them for replay",
        description="Traffic capture at every gateway (shapes, never contents unless a "
        "tenant enables it): start/stop it live, export the trace as JSON lines.",
    )
    cap.add_argument(
        "--redis-url",
        default=os.environ.get("TIERMESH_REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="the mesh's Redis (default: TIERMESH_REDIS_URL or %(default)s)",
    )
    actions = cap.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="sample requests at every gateway from now")
    start.add_argument("--rate", type=float, default=1.0, help="share sampled (default: 1)")
    start.add_argument(
        "--window-s", type=float, default=0.0, help="stop after this long (default: 0, never)"
    )
    actions.add_parser("stop", help="stop sampling at every gateway")
    actions.add_parser("release", help="back to each gateway's TIERMESH_CAPTURE_* settings")
    actions.add_parser("clear", help="delete the captured records")
    export = actions.add_parser("export", help="write the capture as JSON lines")
    export.add_argument("--out", required=True, help="FILE.jsonl")
    actions.add_parser("key", help="print a new key for TIERMESH_CAPTURE_CONTENTS_KEY")

    rep = kinds.add_parser(
        "replay",
        parents=[common_cost],
        help="replay a capture open loop (captured arrival times, synthesised inputs)",
        description="Send a capture's requests again on their captured schedule (open loop),\n"
        "with synthesised inputs of the captured sizes and the captured priorities, and\n"
        "write the bench report (per bucket, priority and tier). Compare two replays of one\n"
        "capture with `tiermesh bench compare`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rep.add_argument("capture", help="a capture export (tiermesh bench capture export)")
    rep.add_argument("--url", default="127.0.0.1:8001", help="the gateway (default: %(default)s)")
    rep.add_argument("--model", default="", help="replay only this model (default: all)")
    rep.add_argument("--speed", type=float, default=1.0, help="time scaling: 2 sends twice as fast")
    rep.add_argument("--seed", type=int, default=0, help="input synthesis seed")
    rep.add_argument("--timeout-s", type=float, default=10.0, help="per request")
    rep.add_argument("--max-in-flight", type=int, default=1024)
    rep.add_argument("--window-s", type=float, default=1.0, help="time-series window")
    rep.add_argument("--out", default=None, help="report directory")


def _cost_args(args: argparse.Namespace) -> tuple[dict[str, tuple[str, ...]], Path | None]:
    """--mesh-metrics and --prices, checked before anything is sent (ValueError)."""
    from tiermesh.bench.cost import parse_targets
    from tiermesh.core.prices import load_prices

    prices_file = Path(args.prices) if args.prices else None
    load_prices(prices_file)
    return parse_targets(args.mesh_metrics or []), prices_file


def _print_cost(report: dict[str, Any]) -> None:
    c = report.get("cost") or {}
    if c.get("per_1k_requests") is not None:
        from tiermesh.bench import markdown

        print(
            f"cost per 1,000 requests {markdown.fmt(c['per_1k_requests'], 6)} {c['currency']}, "
            f"per million tokens {markdown.fmt(c['per_million_tokens'], 4)} {c['currency']}"
        )


def add_bench_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tiermesh.bench.ladder import DEFAULT_STEPS
    from tiermesh.bench.workload import parse_lengths, parse_mix, parse_priorities

    def typed(parse: Any) -> Any:
        def convert(text: str) -> Any:
            try:
                return parse(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        convert.__name__ = parse.__name__.removeprefix("parse_")
        return convert

    def steps(text: str) -> list[int]:
        return [int(x) for x in text.split(",") if x.strip()]

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
        "  tiermesh bench generate --model smollm2 --concurrency 4 --max-new-tokens 16-128\n"
        "  tiermesh bench compare bench-reports/A bench-reports/B   # exit 1: regression",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("target and workload")
    g.add_argument("--url", default="127.0.0.1:8001", help="the gateway (default: %(default)s)")
    g.add_argument("--model", default="mlp", help="(default: %(default)s)")
    g.add_argument("--variant", default="", help="fp32, int8, ... (default: the model's)")
    g.add_argument("--seed", type=int, default=0, help="workload seed (default: %(default)s)")
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
    g.add_argument("--requests", type=int, default=None, help="at most this many (per scenario)")
    g.add_argument(
        "--duration-s", type=float, default=None, help="at most this long (per scenario)"
    )
    g.add_argument(
        "--timeout-s", type=float, default=None, help="per request (default: 10; generate: 120)"
    )
    g.add_argument(
        "--warmup", type=int, default=10, help="unrecorded requests first (default: %(default)s)"
    )
    g = common.add_argument_group("report")
    g.add_argument(
        "--out", default=None, help="report directory (default: bench-reports/<time>-<scenario>)"
    )
    g.add_argument(
        "--window-s", type=float, default=1.0, help="time-series window (default: %(default)s)"
    )
    g.add_argument(
        "--metrics-url",
        default="",
        help="Prometheus endpoint to sample tiermesh_queue_depth from, e.g. "
        "http://127.0.0.1:8002/metrics (default: the client's in-flight count)",
    )
    g.add_argument("--metrics-interval-s", type=float, default=0.5, help="(default: %(default)s)")
    cost_args = argparse.ArgumentParser(add_help=False)
    g = cost_args.add_argument_group("cost")
    g.add_argument(
        "--mesh-metrics",
        action="append",
        metavar="TIER=URL[,URL...]",
        help="the mesh's Prometheus endpoints of one tier (repeat per tier); their CPU time "
        "and count price the run: cost per 1,000 requests and per million tokens",
    )
    g.add_argument(
        "--prices",
        default=None,
        help="prices file (YAML, deploy/prices.yaml; default: its built-in figures)",
    )
    common.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (off anyway when stderr is no terminal)",
    )
    common = argparse.ArgumentParser(add_help=False, parents=[common, cost_args])
    closed = argparse.ArgumentParser(add_help=False)
    closed.add_argument(
        "--concurrency", type=int, default=8, help="callers in a closed loop (default: %(default)s)"
    )

    kinds = bench.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    kinds.add_parser("single", parents=[common], help="one request at a time (200 requests / 60 s)")
    kinds.add_parser(
        "steady", parents=[common, closed], help="closed loop at --concurrency (2000 / 60 s)"
    )
    kinds.add_parser("soak", parents=[common, closed], help="closed loop for a fixed time (300 s)")
    lad = kinds.add_parser("ladder", parents=[common], help="concurrency stepped up to the knee")
    lad.add_argument(
        "--steps",
        type=steps,
        default=list(DEFAULT_STEPS),
        help="concurrencies (default: 1,2,4,...,256)",
    )
    lad.add_argument(
        "--step-requests", type=int, default=400, help="per step (default: %(default)s)"
    )
    lad.add_argument(
        "--step-duration-s", type=float, default=10.0, help="per step (default: %(default)s)"
    )
    lad.add_argument(
        "--slo-ms", type=float, default=None, help="stop when a step's p99 passes this"
    )
    lad.add_argument(
        "--min-gain",
        type=float,
        default=0.05,
        help="throughput gain that counts (default: %(default)s)",
    )
    lad.add_argument(
        "--patience",
        type=int,
        default=2,
        help="steps under --min-gain before stopping (default: %(default)s)",
    )
    lad.add_argument(
        "--max-error-rate", type=float, default=0.01, help="stop above this (default: %(default)s)"
    )
    burst = kinds.add_parser(
        "burst", parents=[common], help="open-loop arrivals with periodic spikes"
    )
    burst.add_argument(
        "--rate", type=float, default=50.0, help="base arrivals / s (default: %(default)s)"
    )
    burst.add_argument(
        "--spike-rate",
        type=float,
        default=200.0,
        help="arrivals / s in a spike (default: %(default)s)",
    )
    burst.add_argument(
        "--spike-every-s", type=float, default=10.0, help="0: no spikes (default: %(default)s)"
    )
    burst.add_argument("--spike-len-s", type=float, default=2.0, help="(default: %(default)s)")
    add_arrival_args(burst)
    add_generate_parser(kinds, common, typed)
    _add_capture_parsers(kinds, cost_args)
    cmp = kinds.add_parser("compare", help="differences between two report directories")
    cmp.add_argument("a", help="the baseline report directory")
    cmp.add_argument("b", help="the report to judge against it")
    cmp.add_argument(
        "--throughput-drop",
        type=float,
        default=0.10,
        help="flag a larger relative drop (default: %(default)s)",
    )
    cmp.add_argument(
        "--p99-rise",
        type=float,
        default=0.10,
        help="flag a larger relative rise (default: %(default)s)",
    )
    cmp.add_argument(
        "--error-rise",
        type=float,
        default=0.01,
        help="flag a larger absolute rise (default: %(default)s)",
    )
    cmp.add_argument(
        "--cost-rise",
        type=float,
        default=0.10,
        help="flag a larger relative rise of cost per request or token (default: %(default)s)",
    )
    cmp.add_argument(
        "--min-ok",
        type=int,
        default=20,
        help="groups answered fewer times are not flagged (default: %(default)s)",
    )
    bench.set_defaults(func=cmd_bench)
