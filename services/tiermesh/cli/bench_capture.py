"""`tiermesh bench capture` (traffic capture at the gateways, through the mesh's Redis) and
`tiermesh bench replay` (a capture sent again, open loop): options and wiring."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tiermesh.cli.args import (
    Parser,
    add_redis_url_arg,
    existing_file,
    nonneg_float,
    positive_float,
    positive_int,
    share,
)
from tiermesh.cli.endpoint import add_url_arg
from tiermesh.cli.errors import usage_errors

# A Redis that does not answer fails the command within this long instead of hanging it.
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_TIMEOUT_S = 10.0


def cmd_capture(args: argparse.Namespace) -> int:
    """`capture start|stop|release|clear|export|key` against the mesh's Redis."""

    from tiermesh.bench import capture
    from tiermesh.core.redis_client import connect_sync

    if args.action == "key":
        print(capture.new_key())
        return 0
    client = connect_sync(
        args.redis_url,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        socket_timeout=REDIS_TIMEOUT_S,
    )
    try:
        if args.action == "start":
            with usage_errors():
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
    finally:
        client.close()
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Drive the mesh with a capture's arrivals and sizes; write the bench report. The
    capture is checked (a bad one: usage error) before anything connects, and the
    gateway asked once whether it is there before the replay starts."""
    import asyncio

    from tiermesh.bench import config, markdown, replay, session
    from tiermesh.bench.report import SUMMARY_MD

    with usage_errors():
        mesh_metrics, prices_file = cost_args(args)
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
        records, _ = replay.replayable(replay.load(cfg.capture), cfg.model)
        if not records:
            raise ValueError(f"{cfg.capture}: no replayable record (model {cfg.model or 'any'})")
    _gateway_answers(cfg.url)  # else every request would fail and the report say so
    measured = asyncio.run(replay.measure(cfg))
    written = session.write(measured, cfg.out_dir)
    o = written.report["overall"]
    print(
        f"{o['ok']}/{o['sent']} answered, {o['throughput_rps']:.1f}/s, "
        f"p50 {markdown.fmt(o['p50_ms'])} ms, p99 {markdown.fmt(o['p99_ms'])} ms, "
        f"error rate {o['error_rate']:.2%}"
    )
    print_cost(written.report)
    print(f"report: {written.out_dir / SUMMARY_MD}")
    return 0


def _gateway_answers(url: str) -> None:
    """One ServerLive call; InferenceServerException (the CLI's error line) when nothing
    answers at `url`."""
    from tiermesh.cli.infer import METADATA_TIMEOUT_S, Endpoint

    client = Endpoint(url=url).client()
    try:
        client.is_server_live(client_timeout=METADATA_TIMEOUT_S)
    finally:
        client.close()


def add_capture_parsers(kinds: Any, cost_parent: argparse.ArgumentParser) -> None:
    cap = kinds.add_parser(
        "capture",
        help="record live traffic shapes at the gateways; export them for replay",
        description="Traffic capture at every gateway (shapes, never contents unless a "
        "tenant enables it): start/stop it live, export the trace as JSON lines.",
    )
    add_redis_url_arg(cap)
    actions = cap.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="sample requests at every gateway from now")
    start.add_argument("--rate", type=share, default=1.0, help="share sampled, (0, 1]")
    start.add_argument(
        "--window-s", type=nonneg_float, default=0.0, help="stop after this long (0: never)"
    )
    actions.add_parser("stop", help="stop sampling at every gateway")
    actions.add_parser("release", help="back to each gateway's TIERMESH_CAPTURE_* settings")
    actions.add_parser("clear", help="delete the captured records")
    export = actions.add_parser("export", help="write the capture as JSON lines")
    export.add_argument("--out", required=True, help="FILE.jsonl")
    actions.add_parser("key", help="print a new key for TIERMESH_CAPTURE_CONTENTS_KEY")

    rep = kinds.add_parser(
        "replay",
        parents=[cost_parent],
        help="replay a capture open loop (captured arrival times, synthesised inputs)",
        description="Send a capture's requests again on their captured schedule (open loop),\n"
        "with synthesised inputs of the captured sizes and the captured priorities, and\n"
        "write the bench report (per bucket, priority and tier). Compare two replays of one\n"
        "capture with `tiermesh bench compare`.",
    )
    rep.add_argument(
        "capture", type=existing_file, help="a capture export (tiermesh bench capture export)"
    )
    add_url_arg(rep)
    rep.add_argument("--model", default="", help="replay only this model (default: all)")
    rep.add_argument(
        "--speed", type=positive_float, default=1.0, help="time scaling: 2 sends twice as fast"
    )
    rep.add_argument("--seed", type=int, default=0, help="input synthesis seed")
    rep.add_argument("--timeout-s", type=positive_float, default=10.0, help="per request")
    rep.add_argument(
        "--max-in-flight",
        type=positive_int,
        default=1024,
        help="arrivals beyond this many outstanding are counted, not sent",
    )
    rep.add_argument("--window-s", type=positive_float, default=1.0, help="time-series window")
    rep.add_argument(
        "--out", default=None, help="report directory (default: bench-reports/<time>-replay)"
    )


def cost_args(args: argparse.Namespace) -> tuple[dict[str, tuple[str, ...]], Path | None]:
    """--mesh-metrics and --prices, checked before anything is sent (ValueError)."""
    from tiermesh.bench.cost import parse_targets
    from tiermesh.core.prices import load_prices

    prices_file = Path(args.prices) if args.prices else None
    load_prices(prices_file)
    return parse_targets(args.mesh_metrics or []), prices_file


def print_cost(report: dict[str, Any]) -> None:
    c = report.get("cost") or {}
    if c.get("per_1k_requests") is not None:
        from tiermesh.bench import markdown

        print(
            f"cost per 1,000 requests {markdown.fmt(c['per_1k_requests'], 6)} {c['currency']}, "
            f"per million tokens {markdown.fmt(c['per_million_tokens'], 4)} {c['currency']}"
        )


def cost_parent() -> Parser:
    """The options that price a run: --mesh-metrics and --prices."""
    parent = Parser(add_help=False)
    g = parent.add_argument_group("cost")
    g.add_argument(
        "--mesh-metrics",
        action="append",
        metavar="TIER=URL[,URL...]",
        help="the mesh's Prometheus endpoints of one tier (repeat per tier); their CPU time "
        "and count price the run: cost per 1,000 requests and per million tokens "
        "(default: none, no cost)",
    )
    g.add_argument(
        "--prices",
        default=None,
        help="prices file (YAML, deploy/prices.yaml; default: its built-in figures)",
    )
    return parent
