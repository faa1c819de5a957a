"""Model-file safety: what may reach an onnxruntime session, checked before one is created.

Every file a session reads must

1. be named by a plain relative path in the config (no absolute path, no ``..``),
2. resolve inside the model repository (a file or folder that is a symlink leading out of
   the repository is refused: its bytes are not the repository's to vouch for),
3. match its recorded sha256, and reach onnxruntime as the very bytes that were hashed
   (read once into memory), so a file changed after the check never reaches a session;
4. when it is ONNX external data, be named by a relative location that stays inside the
   model's own version folder and be one of the version's checksummed files.

The repository (core/repository.py) applies these; the worker, the CLI and the optimizer
share them through it.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import onnx
import yaml

from tiermesh.core.model_config import RepositoryError


@dataclass(frozen=True, slots=True)
class VerifiedModel:
    """A model file's bytes after every check passed; what a session is built from."""

    path: Path
    # Not in the repr: escaping a large model's bytes takes seconds and gigabytes.
    data: bytes = field(repr=False)
    # ONNX external data: location exactly as the model names it -> its verified bytes.
    external: Mapping[str, bytes] = field(default_factory=dict, repr=False)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plain_relative(name: str, where: str) -> PurePosixPath:
    """`name` as a relative path that cannot climb out of its folder; RepositoryError if not."""
    path = PurePosixPath(name)
    if (
        not name
        or "\x00" in name
        or "\\" in name
        or path.is_absolute()
        or any(part in ("..", "") for part in path.parts)
    ):
        raise RepositoryError(
            f"{where}: file name {name!r} must be a relative path inside the folder "
            "(no absolute path, no '..'); refusing to load"
        )
    return path


def inside(root: Path, path: Path, what: str = "the model repository") -> Path:
    """`path` with every symlink resolved, when it stays under `root` (itself resolved)."""
    base = root.resolve()
    resolved = path.resolve()
    if not resolved.is_relative_to(base):
        raise RepositoryError(
            f"{path} resolves to {resolved}, outside {what} {base} (a symlink leading out "
            "of it?); refusing to load"
        )
    return resolved


def read_checked(root: Path, path: Path, expected: str) -> bytes:
    """The bytes of `path` (inside `root`) after they matched the sha256 `expected`."""
    data = existing_file(root, path).read_bytes()
    _compare(path, expected, sha256_bytes(data))
    return data


def check_file(root: Path, path: Path, expected: str) -> None:
    """Like :func:`read_checked` for a file whose bytes are not needed (hashed in chunks)."""
    digest = hashlib.sha256()
    with existing_file(root, path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    _compare(path, expected, digest.hexdigest())


def existing_file(root: Path, path: Path) -> Path:
    """`path` resolved, when it is a file inside `root`; RepositoryError saying what is wrong."""
    resolved = inside(root, path)
    if not resolved.is_file():
        raise RepositoryError(
            f"{path} is missing; build or fetch it first "
            "(`tiermesh models build` / `tiermesh models fetch`)"
        )
    return resolved


def _compare(path: Path, expected: str, actual: str) -> None:
    if actual != expected:
        raise RepositoryError(
            f"{path}: sha256 mismatch, refusing to load (expected {expected or 'none'}"
            f", found {actual})"
        )


def external_locations(data: bytes, path: Path) -> list[str]:
    """The external-data locations an ONNX model refers to (each once, in order)."""
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # the protobuf parser raises several types
        raise RepositoryError(f"{path}: not a readable ONNX model ({exc})") from None
    seen: dict[str, None] = {}
    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in tensor.external_data}
        location = entries.get("location", "")
        seen.setdefault(location, None)
    return list(seen)


def check_external(folder: Path, location: str, model_path: Path) -> PurePosixPath:
    """The location as a path inside `folder`; RepositoryError when it leads elsewhere."""
    where = f"{model_path}: external data"
    name = plain_relative(location, where)
    inside(folder, folder / name, f"the model's folder (external data of {model_path.name})")
    return name


def _tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for graph in attr.graphs:
            yield from _graph_tensors(graph)


# Files larger than this are hard-linked rather than copied when a repository is mirrored.
LINK_ABOVE_BYTES = 1 << 20


def mirror_files(src: Path, dest: Path) -> None:
    """Put a copy of the files of folder `src` (a model version) into `dest`, large ones as
    hard links (cheap, the same bytes). For repositories made from another one (tests,
    benchmarks): a symlink would lead out of the new repository, which it refuses."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in src.iterdir():
        if not path.is_file():
            continue
        if path.stat().st_size > LINK_ABOVE_BYTES:
            try:
                (dest / path.name).hardlink_to(path)
                continue
            except OSError:  # another filesystem: copy instead
                pass
        shutil.copy(path, dest / path.name)


def mirror_model(
    model_dir: Path, root: Path, edit: Callable[[dict[str, Any]], None] | None = None
) -> Path:
    """Put the model of folder `model_dir` into the repository at `root` (created as needed):
    its config.yaml, byte for byte or as `edit` changes the parsed mapping in place, and a
    mirror (`mirror_files`) of each version folder. Returns `root`. For benchmarks and
    tests that serve one committed model with a setting changed."""
    dest = root / model_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    text = (model_dir / "config.yaml").read_text()
    if edit is not None:
        raw = yaml.safe_load(text)
        edit(raw)
        text = yaml.safe_dump(raw, sort_keys=False)
    (dest / "config.yaml").write_text(text)
    for version in model_dir.iterdir():
        if version.is_dir() and version.name.isdigit():
            mirror_files(version, dest / version.name)
    return root
