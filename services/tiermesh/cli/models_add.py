"""`tiermesh models add PATH.onnx` and `tiermesh models import-triton DIR`: a model from an
ONNX file or a Triton model folder, written into the repository after it loaded and ran
once (convert/add_model.py). Argument parsing and printing only."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from tiermesh.cli.args import (
    Subcommands,
    add_repository_arg,
    existing_dir,
    existing_file,
    nonneg_int,
    positive_int,
    repository_of,
)
from tiermesh.cli.errors import usage_errors

if TYPE_CHECKING:
    from tiermesh.convert.add_model import Added, ModelDraft

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # core/model_config.py's NAME, without importing it


def model_name(text: str) -> str:
    if not _NAME.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} must match {_NAME.pattern}")
    return text


def cmd_add(args: argparse.Namespace) -> int:
    """An ONNX file: interface and batching read from its graph."""
    from tiermesh.convert.add_model import DEFAULT_MAX_LENGTH, add_model, onnx_draft
    from tiermesh.convert.onnx_model import ModelAddError, sanitised_name

    with usage_errors(ModelAddError):
        if args.max_length and args.tokenizer is None:
            raise ModelAddError("--max-length goes with --tokenizer (a text model) only")
        draft = onnx_draft(
            args.path,
            args.name or sanitised_name(args.path.stem),
            args.version,
            args.max_batch_size,
            args.tokenizer,
            args.max_length or DEFAULT_MAX_LENGTH,
        )
        added = add_model(repository_of(args), draft, force=args.force)
    _report(f"from {args.path}", draft, added)
    return 0


def cmd_import_triton(args: argparse.Namespace) -> int:
    """A Triton model folder: config.pbtxt mapped field by field."""
    from tiermesh.convert.add_model import add_model
    from tiermesh.convert.onnx_model import ModelAddError
    from tiermesh.convert.triton_import import triton_draft

    with usage_errors(ModelAddError):
        draft = triton_draft(args.folder, args.name)
        added = add_model(repository_of(args), draft, force=args.force)
    _report(f"from Triton model folder {args.folder}", draft, added)
    return 0


def _report(source: str, draft: ModelDraft, added: Added) -> None:
    versions = ", ".join(added.files)
    print(f"added model {draft.name!r} (version {versions}) {source} to {added.folder}")
    for line in draft.summary:
        print(f"  {line}")
    for version, files in added.files.items():
        sums = ", ".join(f"{f} {h[:12]}" for f, h in files.items())
        print(f"  version {version}: sha256 {sums}; {added.ran[version]}")


def add_adding_parsers(actions: Subcommands) -> None:
    """Register `add` and `import-triton` on `tiermesh models`' actions."""
    add = actions.add_parser(
        "add",
        help="add an ONNX file: inputs, outputs and batching read from its graph",
        description="Copy an ONNX file (and its external data) into the repository as "
        "models/NAME/VERSION/model.onnx, write config.yaml from the graph (datatypes, "
        "dynamic dimensions; it batches when every first dimension is dynamic), record "
        "the sha256s, and run it once on zeros before anything is kept.",
    )
    add.add_argument("path", type=existing_file, metavar="PATH.onnx", help="the ONNX file")
    add.add_argument(
        "--name", type=model_name, default=None, help="model name (default: the file's stem)"
    )
    add.add_argument("--version", type=model_name, default="1", help="version folder")
    add.add_argument(
        "--max-batch-size",
        type=nonneg_int,
        default=None,
        help="rows per batch of a batching model; 0: do not batch (default: 8 when every "
        "first dimension is dynamic, else 0)",
    )
    add.add_argument(
        "--tokenizer",
        type=existing_file,
        default=None,
        help="tokenizer.json: a text model (graph inputs input_ids and attention_mask; "
        "default: none, a tensor model)",
    )
    add.add_argument(
        "--max-length",
        type=positive_int,
        default=None,
        help="with --tokenizer: tokens per text at most (default: 256)",
    )
    _common(add)
    add.set_defaults(func=cmd_add)

    triton = actions.add_parser(
        "import-triton",
        help="add a Triton model folder (config.pbtxt + VERSION/model.onnx)",
        description="Map a Triton model folder's config.pbtxt onto config.yaml field by "
        "field (any field that cannot be mapped is named in the refusal), copy the version "
        "folders its version_policy serves, and run each version once before anything is "
        "kept.",
    )
    triton.add_argument("folder", type=existing_dir, metavar="DIR", help="the model folder")
    triton.add_argument(
        "--name", type=model_name, default=None, help="model name (default: config.pbtxt's)"
    )
    _common(triton)
    triton.set_defaults(func=cmd_import_triton)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a model of that name (its whole folder, every version)",
    )
    add_repository_arg(p)
