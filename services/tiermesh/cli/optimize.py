"""`tiermesh optimize`: argument parsing and wiring for tiermesh.optimize.pipeline."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def cmd_optimize(args: argparse.Namespace) -> int:
    from tiermesh.core.repository import RepositoryError
    from tiermesh.optimize import datasets
    from tiermesh.optimize.gate import parse_gate
    from tiermesh.optimize.pipeline import Plan, run

    try:
        gate = parse_gate(args.gate)
        calibration = (
            datasets.read_texts(Path(args.calibration))
            if args.calibration
            else datasets.builtin_texts("calibration")
        )
        evaluation = (
            datasets.read_texts(Path(args.eval)) if args.eval else datasets.builtin_texts("eval")
        )
        out = Path(args.out or f"optimize-reports/{args.model}-{time.strftime('%Y%m%d-%H%M%S')}")
        repository = Path(args.repository or os.environ.get("TIERMESH_MODEL_REPOSITORY", "models"))
        results = run(
            Plan(
                args.model,
                repository,
                out,
                gate,
                calibration,
                evaluation,
                write_back=not args.dry_run,
                progress=sys.stderr.isatty(),
            )
        )
    except (ValueError, KeyError, RepositoryError) as exc:
        print(f"tiermesh optimize: {exc}", file=sys.stderr)
        return 2
    print((out / "report.md").read_text())
    failed = [r.name for r in results if not r.passed]
    if failed:
        print(f"did not pass the gate {gate}: {', '.join(failed)}", file=sys.stderr)
    return 0


def add_optimize_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "optimize",
        help="build FP16/INT8/INT4/mixed variants, gate them against FP32, write the passing",
    )
    p.add_argument("model")
    p.add_argument("--calibration", help="texts, one per line (.txt) or {'text': ...} (.jsonl)")
    p.add_argument("--eval", help="evaluation texts, same formats")
    p.add_argument("--gate", default="cosine>=0.99", help="cosine|cosine_p1|cosine_min>=X")
    p.add_argument("--repository", default=None)
    p.add_argument("--out", default=None, help="report folder")
    p.add_argument("--dry-run", action="store_true", help="report only; write no variant")
    p.set_defaults(func=cmd_optimize)
