"""The `tiermesh` command: argument parsing and wiring only. Its exit statuses and one-line
errors are cli/errors.py's, the shared parser pieces cli/args.py's."""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import PackageNotFoundError, version

from tiermesh.cli.args import (
    Parser,
    add_variant_arg,
    json_value,
    nonempty,
    nonneg_float,
    nonneg_int,
    parse,
    parsers,
    positive_int,
    share,
)
from tiermesh.cli.batch import add_batch_parser
from tiermesh.cli.bench import add_bench_parser
from tiermesh.cli.endpoint import GENERATIVE_MODEL, add_endpoint_args, endpoint_of
from tiermesh.cli.errors import DEBUG_ENV, UsageError, run_command
from tiermesh.cli.keys import add_keys_parser
from tiermesh.cli.models import add_models_parser
from tiermesh.cli.optimize import add_optimize_parser
from tiermesh.cli.probe import add_probe_parser
from tiermesh.cli.profile import add_profile_parser
from tiermesh.cli.rollout import add_rollout_parser
from tiermesh.cli.up import add_up_parser

DISTRIBUTION = "tiermesh"
DESCRIPTION = """tiermesh: an async gRPC inference-serving mesh (KServe v2), its load
generator and its model tools.

Exit status, in every subcommand: 0 done, 1 a runtime error (nothing answers, the server
or the model repository refuses), 2 a usage error (the command line, or an input file it
names, is wrong; checked before anything connects). An error is one line on stderr;
TIERMESH_DEBUG=1 (or --debug) shows an unexpected one's traceback."""


def cmd_infer(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import infer

    texts = [*(args.texts or []), *(args.text or [])]
    if (args.data is None) == (not texts):
        raise UsageError(
            "give --data JSON for a numeric input or texts for a text input, one of them"
        )
    answer = infer(
        endpoint_of(args),
        args.model,
        args.data,
        texts,
        args.timeout_us,
        args.priority,
        args.variant,
    )
    print(json.dumps(answer, indent=2))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from tiermesh.cli.generate import Ask, run

    ask = Ask(
        args.prompt, args.max_new_tokens, args.temperature, args.top_p, args.seed, tuple(args.stop)
    )
    return run(endpoint_of(args), args.model, ask, stream=not args.no_stream)


def cmd_similarity(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import similarity

    print(f"{similarity(endpoint_of(args), args.model, args.a, args.b, args.variant):.6f}")
    return 0


def _package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="tiermesh", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"%(prog)s {_package_version()}")
    p.add_argument(
        "--debug",
        action="store_true",
        help=f"let an unexpected error show its traceback (as {DEBUG_ENV}=1 does)",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    add_up_parser(sub)

    inf = sub.add_parser("infer", help="send one request with tritonclient")
    inf.add_argument(
        "texts", nargs="*", help="texts for a model that takes text (default: none; or --data)"
    )
    add_endpoint_args(inf)
    inf.add_argument("--model", default="mlp", help="the model to ask")
    inf.add_argument(
        "--data",
        type=json_value,
        help="JSON array for a numeric input, batch first, e.g. '[[1, 2, 3, 4]]' "
        "(default: none; or texts)",
    )
    inf.add_argument(
        "--text", action="append", help="text for a BYTES input (repeatable; default: none)"
    )
    inf.add_argument(
        "--timeout-us",
        type=positive_int,
        default=None,
        help="the request's timeout parameter, microseconds (default: none)",
    )
    inf.add_argument(
        "--priority", type=nonneg_int, default=0, help="priority level (0: the model's own)"
    )
    add_variant_arg(inf)
    inf.set_defaults(func=cmd_infer)

    gen = sub.add_parser(
        "generate", help="one prompt to a generative model; the answer printed as it comes"
    )
    gen.add_argument("prompt", type=nonempty, help="what to ask")
    add_endpoint_args(gen)
    gen.add_argument("--model", default=GENERATIVE_MODEL, help="a generative model")
    gen.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=None,
        help="longest answer, tokens (default: the model's)",
    )
    gen.add_argument(
        "--temperature",
        type=nonneg_float,
        default=None,
        help="sampling temperature (default: 0, greedy)",
    )
    gen.add_argument(
        "--top-p",
        type=share,
        default=None,
        help="nucleus sampling share, (0, 1] (default: 1, no cut)",
    )
    gen.add_argument(
        "--seed", type=nonneg_int, default=None, help="sampling seed (default: none, random)"
    )
    gen.add_argument(
        "--stop",
        type=nonempty,
        action="append",
        default=[],
        help="a stop string (repeatable; default: none)",
    )
    gen.add_argument("--no-stream", action="store_true", help="ModelInfer: the whole answer")
    gen.set_defaults(func=cmd_generate)

    sim = sub.add_parser("similarity", help="cosine similarity of two texts' embeddings")
    sim.add_argument("a", help="the first text")
    sim.add_argument("b", help="the second text")
    add_endpoint_args(sim)
    sim.add_argument("--model", default="minilm-l6", help="an embedding model")
    add_variant_arg(sim)
    sim.set_defaults(func=cmd_similarity)

    add_models_parser(sub)
    add_bench_parser(sub)
    add_profile_parser(sub)
    add_optimize_parser(sub)
    add_keys_parser(sub)
    add_rollout_parser(sub)
    add_probe_parser(sub)
    add_batch_parser(sub)
    for each in parsers(p):
        # Which subcommand runs, for its error lines (the innermost parser's wins).
        each.set_defaults(cli_prog=each.prog)
    return p


def main(argv: list[str] | None = None) -> int:
    """The `tiermesh` entry point: a usage error found by argparse exits (SystemExit 2);
    anything a subcommand raises becomes one line on stderr and the status returned."""
    args = parse(parser(), argv)
    return run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
