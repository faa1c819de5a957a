"""What a model's config.yaml says, parsed into frozen dataclasses.

A model has a public interface (``inputs``/``outputs``: what clients send and get) and a
compute interface (``compute``: what onnxruntime runs), equal unless the model pre- or
post-processes. Companion models share a model's queues, batching and weights under another
public interface (``minilm-l6-ids`` takes token ids where ``minilm-l6`` takes text).
Variants (fp32, int8, ...) are files of one version; each variant batches on its own.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tiermesh.core.tensors import DATATYPES

NAME = re.compile(r"^[A-Za-z0-9_-]+$")


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
    files: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class TokenizeSpec:
    """Router-side text input processing: WordPiece via the `tokenizers` library."""

    tokenizer_file: str
    max_length: int
    max_text_bytes: int = 16_384


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """Postprocess: mean over tokens weighted by the mask, then L2 normalisation."""

    source: str
    mask: str
    output: str


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
    # variant -> model file of each version; the default variant is served when a request
    # names none.
    variants: Mapping[str, str] = field(default_factory=lambda: {"fp32": "model.onnx"})
    default_variant: str = "fp32"
    # The compute interface; empty means the public one.
    compute_inputs: tuple[TensorSpec, ...] = ()
    compute_outputs: tuple[TensorSpec, ...] = ()
    # Pad value per compute input: inputs listed here are padded to the longest in a batch.
    pad: Mapping[str, int] = field(default_factory=dict)
    tokenize: TokenizeSpec | None = None
    pool: PoolSpec | None = None
    # Longest sequence (any dynamic dimension) a request may carry; 0 = no limit.
    max_sequence: int = 0
    # The model whose queues, batching and weights this one uses ("" = itself).
    companion_of: str = ""

    @property
    def queue_model(self) -> str:
        return self.companion_of or self.name

    @property
    def runs_inputs(self) -> tuple[TensorSpec, ...]:
        return self.compute_inputs or self.inputs

    @property
    def runs_outputs(self) -> tuple[TensorSpec, ...]:
        return self.compute_outputs or self.outputs

    @property
    def model_file(self) -> str:
        return self.variants[self.default_variant]

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


def _optional(raw: Any, key: str) -> dict[str, Any] | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RepositoryError(f"{key} must be a mapping")
    return value


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
        compute = _optional(raw, "compute") or {}
        tokenize = _optional(raw, "tokenize")
        pool = _optional(raw, "pool")
        variants = {str(k): str(v) for k, v in (raw.get("variants") or {}).items()}
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
            variants=variants or {"fp32": str(raw.get("model_file", "model.onnx"))},
            default_variant=str(raw.get("default_variant", next(iter(variants), "fp32"))),
            compute_inputs=(
                _tensor_specs(compute["inputs"], f"{where} compute.inputs") if compute else ()
            ),
            compute_outputs=(
                _tensor_specs(compute["outputs"], f"{where} compute.outputs") if compute else ()
            ),
            pad={str(k): int(v) for k, v in (compute.get("pad") or {}).items()},
            tokenize=TokenizeSpec(
                tokenizer_file=str(tokenize["tokenizer"]),
                max_length=int(tokenize["max_length"]),
                max_text_bytes=int(tokenize.get("max_text_bytes", 16_384)),
            )
            if tokenize
            else None,
            pool=PoolSpec(str(pool["source"]), str(pool["mask"]), str(pool["output"]))
            if pool
            else None,
            max_sequence=int(tokenize["max_length"]) if tokenize else 0,
        )
    except RepositoryError as exc:
        raise RepositoryError(f"{where}: {exc}") from exc
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # AttributeError: a section of the wrong shape (a list where a mapping belongs).
        raise RepositoryError(f"{where}: {exc.__class__.__name__}: {exc}") from exc
    _check(cfg, where)
    return cfg


def _check(cfg: ModelConfig, where: str) -> None:
    if not NAME.match(cfg.name):
        raise RepositoryError(f"{where}: model name {cfg.name!r} must match {NAME.pattern}")
    if not cfg.versions:
        raise RepositoryError(f"{where}: no versions")
    if cfg.max_batch_size < 0 or cfg.queue_bound < 1 or cfg.priority_levels < 1:
        raise RepositoryError(f"{where}: max_batch_size, queue_bound, priority_levels out of range")
    if not 1 <= cfg.default_priority <= cfg.priority_levels:
        raise RepositoryError(f"{where}: default_priority must be in 1..priority_levels")
    bounds = cfg.length_buckets
    if any(b < 1 for b in bounds) or any(a >= b for a, b in itertools.pairwise(bounds)):
        raise RepositoryError(f"{where}: length_buckets must be positive and ascending")
    if cfg.default_variant not in cfg.variants:
        raise RepositoryError(f"{where}: default_variant {cfg.default_variant!r} is not a variant")
    if not all(NAME.match(v) for v in cfg.variants):
        raise RepositoryError(f"{where}: variant names must match {NAME.pattern}")
    for ver in cfg.versions:
        for file in cfg.variants.values():
            if file not in ver.files:
                raise RepositoryError(f"{where}: version {ver.version} lists no sha256 for {file}")
    computed = {t.name for t in cfg.runs_inputs}
    if unknown := set(cfg.pad) - computed:
        raise RepositoryError(f"{where}: pad names unknown compute inputs {sorted(unknown)}")
    if cfg.pool and {cfg.pool.source, cfg.pool.mask} - computed - {
        t.name for t in cfg.runs_outputs
    }:
        raise RepositoryError(f"{where}: pool source/mask must be compute inputs or outputs")
    if cfg.pool and cfg.pool.output not in {t.name for t in cfg.outputs}:
        raise RepositoryError(f"{where}: pool output {cfg.pool.output!r} is not a model output")


def companions(raw: Any, parent: ModelConfig, where: str) -> list[ModelConfig]:
    """The companion models a config declares: the parent's compute, another public input."""
    out = []
    for item in raw.get("companions") or []:
        try:
            name = str(item["name"])
            inputs = _tensor_specs(item["inputs"], f"{where} companion {name} inputs")
        except (KeyError, TypeError) as exc:
            raise RepositoryError(f"{where}: each companion needs name and inputs") from exc
        cfg = replace(parent, name=name, inputs=inputs, tokenize=None, companion_of=parent.name)
        _check(cfg, where)
        if not _same_interface(inputs, parent.runs_inputs):
            raise RepositoryError(
                f"{where}: companion {name} must take the compute inputs (names, datatypes, "
                "ranks; a fixed dimension only where the compute one is dynamic or equal)"
            )
        out.append(cfg)
    return out


def _same_interface(given: tuple[TensorSpec, ...], compute: tuple[TensorSpec, ...]) -> bool:
    return len(given) == len(compute) and all(
        a.name == b.name
        and a.datatype == b.datatype
        and len(a.dims) == len(b.dims)
        and all(want in (-1, got) for got, want in zip(a.dims, b.dims, strict=True))
        for a, b in zip(given, compute, strict=True)
    )
