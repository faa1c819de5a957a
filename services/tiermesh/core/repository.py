"""The model repository: ``models/<name>/config.yaml`` and ``models/<name>/<version>/<file>``.

Configs are committed; weights are built or fetched and checked against the sha256 in the
config before any service uses them. A mismatch refuses to load with a clear error.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tiermesh.core.tensors import DATATYPES


class RepositoryError(Exception):
    """A model config or model file is missing, malformed or does not match its checksum."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: str
    # Dimensions without the batch dimension when the model batches; -1 is dynamic.
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelVersion:
    version: str
    # file name (relative to the version folder) -> expected sha256 hex digest
    files: dict[str, str]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    versions: tuple[ModelVersion, ...]
    max_batch_wait_ms: float = 2.0
    queue_bound: int = 1024
    priority_levels: int = 2
    default_priority: int = 2
    # Upper bounds (inclusive) of the length buckets; empty means one bucket.
    length_buckets: tuple[int, ...] = ()
    model_file: str = "model.onnx"

    @property
    def latest(self) -> ModelVersion:
        return max(self.versions, key=lambda v: int(v.version) if v.version.isdigit() else -1)

    def version(self, version: str) -> ModelVersion | None:
        """The named version, or the latest when `version` is empty; None when unknown."""
        if not version:
            return self.latest
        return next((v for v in self.versions if v.version == version), None)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def bucket_count(self) -> int:
        return max(1, len(self.length_buckets))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _tensor_specs(raw: Any, where: str) -> tuple[TensorSpec, ...]:
    if not isinstance(raw, list) or not raw:
        raise RepositoryError(f"{where}: must be a non-empty list")
    specs = []
    for item in raw:
        try:
            spec = TensorSpec(str(item["name"]), str(item["datatype"]), tuple(item["dims"]))
        except (KeyError, TypeError) as exc:
            raise RepositoryError(f"{where}: each entry needs name, datatype, dims") from exc
        if spec.datatype not in DATATYPES:
            raise RepositoryError(f"{where}: unknown datatype {spec.datatype!r} of {spec.name}")
        if not all(isinstance(d, int) and (d > 0 or d == -1) for d in spec.dims):
            raise RepositoryError(f"{where}: dims of {spec.name} must be positive or -1")
        specs.append(spec)
    return tuple(specs)


def parse_config(raw: Any, where: str) -> ModelConfig:
    """Build a ModelConfig from the parsed YAML of config.yaml; raise RepositoryError."""
    if not isinstance(raw, dict):
        raise RepositoryError(f"{where}: expected a mapping")
    try:
        versions = tuple(
            ModelVersion(str(v), {str(f): str(h) for f, h in (files or {}).items()})
            for v, files in dict(raw["versions"]).items()
        )
        batching = raw.get("batching", {}) or {}
        cfg = ModelConfig(
            name=str(raw["name"]),
            platform=str(raw.get("platform", "onnxruntime_onnx")),
            max_batch_size=int(raw.get("max_batch_size", 0)),
            inputs=_tensor_specs(raw.get("inputs"), f"{where} inputs"),
            outputs=_tensor_specs(raw.get("outputs"), f"{where} outputs"),
            versions=versions,
            max_batch_wait_ms=float(batching.get("max_batch_wait_ms", 2.0)),
            queue_bound=int(raw.get("queue_bound", 1024)),
            priority_levels=int(raw.get("priority_levels", 2)),
            default_priority=int(raw.get("default_priority") or raw.get("priority_levels") or 2),
            length_buckets=tuple(int(b) for b in raw.get("length_buckets", ()) or ()),
            model_file=str(raw.get("model_file", "model.onnx")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # AttributeError: a section of the wrong shape (a list where a mapping belongs).
        raise RepositoryError(f"{where}: {exc.__class__.__name__}: {exc}") from exc
    if not cfg.versions:
        raise RepositoryError(f"{where}: no versions")
    if cfg.max_batch_size < 0 or cfg.queue_bound < 1 or cfg.priority_levels < 1:
        raise RepositoryError(f"{where}: max_batch_size, queue_bound, priority_levels out of range")
    if not 1 <= cfg.default_priority <= cfg.priority_levels:
        raise RepositoryError(f"{where}: default_priority must be in 1..priority_levels")
    bounds = cfg.length_buckets
    if any(b < 1 for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise RepositoryError(f"{where}: length_buckets must be positive and ascending")
    for ver in cfg.versions:
        if cfg.model_file not in ver.files:
            raise RepositoryError(
                f"{where}: version {ver.version} lists no sha256 for {cfg.model_file}"
            )
    return cfg


class ModelRepository:
    """Reads model configs and hands out checked model files. Built once per service."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._configs: dict[str, ModelConfig] = {}

    def load(self) -> dict[str, ModelConfig]:
        """Read every models/<name>/config.yaml; called once at service start."""
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {self.root} does not exist")
        configs: dict[str, ModelConfig] = {}
        for path in sorted(self.root.glob("*/config.yaml")):
            try:
                raw = yaml.safe_load(path.read_text())
            except yaml.YAMLError as exc:
                raise RepositoryError(f"{path}: not valid YAML: {exc}") from exc
            cfg = parse_config(raw, str(path))
            if cfg.name != path.parent.name:
                raise RepositoryError(f"{path}: name {cfg.name!r} != folder {path.parent.name!r}")
            configs[cfg.name] = cfg
        self._configs = configs
        return configs

    @property
    def configs(self) -> dict[str, ModelConfig]:
        return self._configs

    def get(self, name: str) -> ModelConfig | None:
        return self._configs.get(name)

    def checked_file(self, name: str, version: str = "") -> Path:
        """The model file of (name, version) after its sha256 matched the config.

        Raises RepositoryError naming the file, the expected and the actual digest.
        """
        cfg = self._configs.get(name)
        if cfg is None:
            raise RepositoryError(f"unknown model {name!r}")
        ver = cfg.version(version)
        if ver is None:
            raise RepositoryError(f"model {name!r} has no version {version!r}")
        folder = self.root / name / ver.version
        for file, expected in ver.files.items():
            path = folder / file
            if not path.is_file():
                raise RepositoryError(
                    f"{path} is missing; build or fetch it first (`tiermesh models build`)"
                )
            actual = sha256_file(path)
            if actual != expected:
                raise RepositoryError(
                    f"{path}: sha256 mismatch, refusing to load (expected {expected}, "
                    f"found {actual})"
                )
        return folder / cfg.model_file
