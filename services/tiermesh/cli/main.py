"""The `tiermesh` command: argument parsing and wiring only."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tiermesh.cli.bench import add_bench_parser
from tiermesh.cli.optimize import add_optimize_parser
from tiermesh.cli.profile import add_profile_parser
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
            metrics_port=args.metrics_port,
            trace_ui=os.environ.get("TIERMESH_TRACE_UI", "") not in ("", "0", "false"),
            tiers=tuple(t.strip() for t in args.tiers.split(",") if t.strip()),
            edge_threads=args.edge_threads,
            edge_link_ms=args.edge_link_ms,
        )
    )


def cmd_infer(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import infer

    texts = [*(args.texts or []), *(args.text or [])]
    answer = infer(
        args.url, args.model, args.data, texts, args.timeout_us, args.priority, args.variant
    )
    print(json.dumps(answer, indent=2))
    return 0


def cmd_similarity(args: argparse.Namespace) -> int:
    from tiermesh.cli.infer import similarity

    print(f"{similarity(args.url, args.model, args.a, args.b, args.variant):.6f}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """build: the built-in models; fetch: the real ones; both then verify what they made.
    verify: every model's checksums; list: what the repository holds."""
    root = _repo_path(args)
    made: list[str] | None = None
    try:
        if args.action == "build":
            made = [path.parent.parent.name for path in build_into(root)]
        elif args.action == "fetch":
            made = _fetch(root, args)
    except (ValueError, RuntimeError) as exc:
        print(f"tiermesh models {args.action}: {exc}", file=sys.stderr)
        return 1
    repo = ModelRepository(root)
    try:
        for name, cfg in repo.load().items():
            if made is not None and cfg.queue_model not in made:
                continue
            checked = args.action != "list"
            if checked:
                repo.checked_folder(name)
            versions = [v.version for v in cfg.versions]
            print(
                f"{name}: versions {versions}, variants {sorted(cfg.variants)}, "
                f"max_batch_size {cfg.max_batch_size}" + (" (sha256 ok)" if checked else "")
            )
    except RepositoryError as exc:
        print(f"tiermesh models: {exc}", file=sys.stderr)
        return 1
    return 0


def _fetch(root: Path, args: argparse.Namespace) -> list[str]:
    from tiermesh.convert.fetch import default_cache_dir
    from tiermesh.convert.minilm import MODELS, fetch_minilm

    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    folders = fetch_minilm(root, cache, progress=True, which=args.names or list(MODELS))
    return list(folders)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiermesh", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run the whole mesh locally until Ctrl-C")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8001)
    up.add_argument("--data-dir", default=".tiermesh", help="private redis data (AOF) lives here")
    up.add_argument("--repository", default=None, help="model repository (default: models)")
    up.add_argument("--grace", type=float, default=10.0, help="drain grace per service, seconds")
    up.add_argument(
        "--metrics-port", type=int, default=8002, help="gateway's Prometheus port (0: any free)"
    )
    up.add_argument("--tiers", default="center,edge", help="worker tiers to start")
    up.add_argument(
        "--edge-threads", type=int, default=1, help="onnxruntime threads of the edge worker"
    )
    up.add_argument(
        "--edge-link-ms",
        type=float,
        default=0.0,
        help="added round trip (ms) between the edge worker and redis/postprocess (0: none)",
    )
    up.set_defaults(func=cmd_up)

    inf = sub.add_parser("infer", help="send one request with tritonclient")
    inf.add_argument("texts", nargs="*", help="texts for a model that takes text")
    inf.add_argument("--url", default="127.0.0.1:8001")
    inf.add_argument("--model", default="mlp")
    inf.add_argument("--data", help="JSON array for a numeric input, batch first")
    inf.add_argument("--text", action="append", help="text for a BYTES input (repeatable)")
    inf.add_argument("--timeout-us", type=int, default=None)
    inf.add_argument("--priority", type=int, default=0)
    inf.add_argument("--variant", default="", help="fp32, int8, ... (default: the model's)")
    inf.set_defaults(func=cmd_infer)

    sim = sub.add_parser("similarity", help="cosine similarity of two texts' embeddings")
    sim.add_argument("a")
    sim.add_argument("b")
    sim.add_argument("--url", default="127.0.0.1:8001")
    sim.add_argument("--model", default="minilm-l6")
    sim.add_argument("--variant", default="")
    sim.set_defaults(func=cmd_similarity)

    models = sub.add_parser("models", help="build, verify or list the model repository")
    models.add_argument("action", choices=["build", "fetch", "verify", "list"])
    models.add_argument("names", nargs="*", help="fetch: which models (default: all)")
    models.add_argument("--repository", default=None)
    models.add_argument("--cache-dir", default=None, help="fetch: downloads and conversions")
    models.set_defaults(func=cmd_models)

    add_bench_parser(sub)
    add_profile_parser(sub)
    add_optimize_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
