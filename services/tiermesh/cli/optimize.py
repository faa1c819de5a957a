"""`tiermesh optimize`: argument parsing and wiring for tiermesh.optimize.pipeline."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tiermesh.cli.args import Subcommands, add_repository_arg, existing_file, repository_of
from tiermesh.cli.errors import CliError, usage_errors


def cmd_optimize(args: argparse.Namespace) -> int:
    """The text files are read before any work (a bad one: usage error); the repository's
    and the pipeline's refusals are runtime errors."""
    from tiermesh.core.repository import ModelRepository
    from tiermesh.optimize import datasets
    from tiermesh.optimize.pipeline import Plan, run

    with usage_errors():
        calibration = (
            datasets.read_texts(args.calibration)
            if args.calibration
            else datasets.builtin_texts("calibration")
        )
        evaluation = datasets.read_texts(args.eval) if args.eval else datasets.builtin_texts("eval")
    out = Path(args.out or f"optimize-reports/{args.model}-{time.strftime('%Y%m%d-%H%M%S')}")
    repository = repository_of(args)
    known = ModelRepository(repository).load()
    if args.model not in known:
        raise CliError(f"unknown model {args.model!r} in {repository}; known: {', '.join(known)}")
    results = run(
        Plan(
            args.model,
            repository,
            out,
            args.gate,
            calibration,
            evaluation,
            write_back=not args.dry_run,
            progress=sys.stderr.isatty(),
            variants=args.variants,
        )
    )
    print((out / "report.md").read_text())
    failed = [r.name for r in results if not r.passed]
    if failed:
        print(f"did not pass the gate {args.gate}: {', '.join(failed)}", file=sys.stderr)
    return 0


def _gate(text: str) -> Any:
    from tiermesh.optimize.gate import parse_gate

    try:
        return parse_gate(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _variants(text: str) -> tuple[str, ...]:
    from tiermesh.optimize.pipeline import BUILDERS

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in BUILDERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant(s) {', '.join(unknown) or 'none'}: choose from {', '.join(BUILDERS)}"
        )
    return names


def add_optimize_parser(sub: Subcommands) -> None:
    p = sub.add_parser(
        "optimize",
        help="build FP16/INT8/INT4/mixed variants, gate them against FP32, write the passing",
    )
    p.add_argument("model", help="a text model of the repository")
    p.add_argument(
        "--calibration",
        type=existing_file,
        help="texts, one per line (.txt) or {'text': ...} (.jsonl) (default: a built-in set)",
    )
    p.add_argument(
        "--eval",
        type=existing_file,
        help="evaluation texts, same formats (default: a built-in set)",
    )
    p.add_argument(
        "--gate", type=_gate, default="cosine>=0.99", help="cosine|cosine_p1|cosine_min>=X"
    )
    add_repository_arg(p)
    p.add_argument(
        "--out", default=None, help="report folder (default: optimize-reports/<model>-<time>)"
    )
    p.add_argument("--dry-run", action="store_true", help="report only; write no variant")
    p.add_argument(
        "--variants",
        type=_variants,
        default=(),
        help="build only these, comma-separated: graph, fp16, int8dyn, int8qdq (its mixed "
        "fallback, int8mixed, comes with it), int4 (default: all)",
    )
    p.set_defaults(func=cmd_optimize)
