"""The `tiermesh` command: argument parsing and wiring only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tiermesh.core.builtin_models import build_into
from tiermesh.core.repository import ModelRepository, RepositoryError


def _repo_path(args: argparse.Namespace) -> Path:
    return Path(args.repository or os.environ.get("TIERMESH_MODEL_REPOSITORY", "models"))


def cmd_up(args: argparse.Namespace) -> int:
    from tiermesh.up.supervisor import UpOptions, run

    return run(
        UpOptions(
            host=args.host,
            port=args.port,
            redis_url=os.environ.get("TIERMESH_REDIS_URL", ""),
            data_dir=Path(args.data_dir),
            model_repository=_repo_path(args),
            grace_s=args.grace,
        )
    )


def cmd_infer(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import infer

    answer = infer(args.url, args.model, args.data, args.text, args.timeout_us, args.priority)
    print(json.dumps(answer, indent=2))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    root = _repo_path(args)
    if args.action == "build":
        for path in build_into(root):
            print(f"built {path}")
    repo = ModelRepository(root)
    try:
        configs = repo.load()
        for name, cfg in configs.items():
            if args.action in ("verify", "build"):
                repo.checked_file(name)
            print(
                f"{name}: versions {[v.version for v in cfg.versions]}, "
                f"max_batch_size {cfg.max_batch_size}"
                + (" (sha256 ok)" if args.action != "list" else "")
            )
    except RepositoryError as exc:
        print(f"tiermesh models: {exc}", file=sys.stderr)
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiermesh", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole mesh locally until Ctrl-C")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8001)
    up.add_argument("--data-dir", default=".tiermesh", help="private redis data (AOF) lives here")
    up.add_argument("--repository", default=None, help="model repository (default: models)")
    up.add_argument("--grace", type=float, default=10.0, help="drain grace per service, seconds")
    up.set_defaults(func=cmd_up)

    inf = sub.add_parser("infer", help="send one request with tritonclient")
    inf.add_argument("--url", default="127.0.0.1:8001")
    inf.add_argument("--model", default="mlp")
    inf.add_argument("--data", help="JSON array for a numeric input, batch first")
    inf.add_argument("--text", action="append", help="text for a BYTES input (repeatable)")
    inf.add_argument("--timeout-us", type=int, default=None)
    inf.add_argument("--priority", type=int, default=0)
    inf.set_defaults(func=cmd_infer)

    models = sub.add_parser("models", help="build, verify or list the model repository")
    models.add_argument("action", choices=["build", "verify", "list"])
    models.add_argument("--repository", default=None)
    models.set_defaults(func=cmd_models)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
