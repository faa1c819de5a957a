"""`tiermesh profile`: argument parsing and wiring for tiermesh.optimize.profile."""

from __future__ import annotations

import argparse

from tiermesh.cli.args import (
    Subcommands,
    add_repository_arg,
    add_variant_arg,
    positive_float,
    positive_int,
    repository_of,
)


def cmd_profile(args: argparse.Namespace) -> int:
    """Print the profile of one model of the repository (checksums verified first)."""
    import onnx
    import onnxruntime as ort

    from tiermesh.core.repository import ModelRepository
    from tiermesh.optimize import profile as prof

    repo = ModelRepository(repository_of(args))
    repo.load()  # RepositoryError (unknown model, missing weights): the CLI's error line
    path = repo.checked_file(args.model, variant=args.variant)
    cfg = repo.configs[args.model]
    variant = cfg.variant_for(args.variant)
    model = onnx.load(str(path))
    available = ort.get_available_providers()
    result = prof.profile(model, args.seq, args.balance, available)
    matrix = prof.verify_installed(result.matrix, model.SerializeToString(), available, args.seq)
    result = prof.ModelProfile(
        result.parameters, result.ops, result.compute, result.dynamic_axes, matrix
    )
    if args.json:
        print(prof.as_json(result))
    else:
        print(prof.render(args.model, variant, result, args.top), end="")
    return 0


def add_profile_parser(sub: Subcommands) -> None:
    from tiermesh.optimize.profile import CPU_MACHINE_BALANCE

    p = sub.add_parser(
        "profile", help="parameters, ops, FLOP estimates, dynamic axes and EP support of a model"
    )
    p.add_argument("model", help="a model of the repository")
    add_repository_arg(p)
    add_variant_arg(p)
    p.add_argument(
        "--seq", type=positive_int, default=128, help="reference sequence length (tokens)"
    )
    p.add_argument(
        "--balance",
        type=positive_float,
        default=CPU_MACHINE_BALANCE,
        help="machine balance, FLOP/byte, for the compute/memory-bound verdict",
    )
    p.add_argument("--top", type=positive_int, default=10, help="op types shown before 'others'")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_profile)
