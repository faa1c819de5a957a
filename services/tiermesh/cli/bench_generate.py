"""`tiermesh bench generate`: the generation scenario's options, parsed into a
GenerationPlan (tiermesh.bench.genwork); the options of open-loop arrivals it shares with
`burst`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiermesh.bench.genwork import GenerationPlan


def generation_plan(args: argparse.Namespace) -> GenerationPlan:
    """The generate scenario's GenerationPlan from its options (ValueError: a bad one)."""
    from tiermesh.bench.genwork import DEFAULT_MAX_NEW_TOKENS, GenerationPlan
    from tiermesh.bench.prompts import BUILTIN, BUILTIN_PROMPTS, load_prompts

    if args.rate is not None and args.concurrency is not None:
        raise ValueError(
            "give --concurrency (closed loop) or --rate (open loop, arrivals / s), not both"
        )
    if args.rate is not None and not args.rate > 0:
        raise ValueError(f"--rate must be > 0 arrivals / s, got {args.rate:g}")
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {args.concurrency}")
    prompts = load_prompts(Path(args.prompts)) if args.prompts else BUILTIN_PROMPTS
    return GenerationPlan(
        prompts=prompts,
        prompts_source=args.prompts or BUILTIN,
        max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        temperature=args.temperature,
        top_p=args.top_p,
        stop=args.stop or "",
        stream=not args.no_stream,
        rate_rps=args.rate or 0.0,
        poisson=args.arrivals == "poisson",
    )


def add_generate_parser(kinds: Any, common: argparse.ArgumentParser, typed: Any) -> None:
    from tiermesh.bench.genwork import parse_max_new_tokens, parse_stop

    gen = kinds.add_parser(
        "generate",
        parents=[common],
        help="generation requests to a generative model: TTFT, TPOT, tokens/s",
        description="Generation requests (prompt + max_new_tokens, temperature, top_p, seed,\n"
        "stop) to a generative model (a BYTES text_input, decoupled), streamed by default\n"
        "(ModelStreamInfer: one response per piece of text). Reports time to first token\n"
        "(TTFT) and time per output token (TPOT) percentiles, client- and server-side,\n"
        "and generated tokens/s; closed loop at --concurrency or open loop at --rate.\n"
        "Bounds default to 200 requests or 120 s, the timeout to 120 s per request.",
        epilog="examples:\n"
        "  tiermesh bench generate --concurrency 4 --requests 100\n"
        "  tiermesh bench generate --rate 2 --max-new-tokens 32-64=0.8,256=0.2\n"
        "  tiermesh bench generate --model smollm2 --prompts prompts.jsonl --no-stream",
    )
    g = gen.add_argument_group("generation")
    g.add_argument(
        "--max-new-tokens",
        type=typed(parse_max_new_tokens),
        default=None,
        metavar="N|MIN-MAX[=SHARE],...",
        help="answer lengths asked: N, a range drawn uniformly, or a mix of them "
        "(default: 16-48=0.5,48-128=0.35,128-256=0.15)",
    )
    g.add_argument(
        "--prompts",
        default=None,
        metavar="FILE",
        help='one prompt per line, or .jsonl: a JSON string or {"prompt": ...} per line '
        "(default: a built-in set of varied chat prompts)",
    )
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature, 0: greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling share, (0, 1]")
    g.add_argument(
        "--stop",
        type=typed(parse_stop),
        default=None,
        help='a stop string, or a JSON list of them, e.g. \'["\\n\\n", "User:"]\' (default: none)',
    )
    g.add_argument(
        "--no-stream",
        action="store_true",
        help="ModelInfer: one response per request (no client TPOT; client TTFT = the call)",
    )
    g = gen.add_argument_group("load (one of)")
    g.add_argument(
        "--concurrency", type=int, default=None, help="callers in a closed loop (default: 8)"
    )
    g.add_argument(
        "--rate", type=float, default=None, help="open loop instead: arrivals / s (default: none)"
    )
    add_arrival_args(g, "open loop: ")


def add_arrival_args(parser: Any, scope: str = "") -> None:
    """--arrivals and --max-in-flight of an open-loop scenario; `scope` starts the help."""
    parser.add_argument(
        "--arrivals",
        choices=["poisson", "uniform"],
        default="poisson",
        help=f"{scope}random (poisson) or evenly spaced (uniform) arrival times",
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        default=1024,
        help=f"{scope}arrivals beyond this many outstanding are counted, not sent "
        "(default: %(default)s)",
    )
