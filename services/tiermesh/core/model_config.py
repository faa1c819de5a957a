"""What a model's config.yaml says, parsed into frozen dataclasses.

A model has a public interface (``inputs``/``outputs``: what clients send and get) and a
compute interface (``compute``: what onnxruntime runs), equal unless the model pre- or
post-processes. Companion models share a model's queues, batching and weights under another
public interface (``minilm-l6-ids`` takes token ids where ``minilm-l6`` takes text).
Variants (fp32, int8, ...) are files of one version; each variant batches on its own.

Tiers (where a model is served, and which variant each tier serves) are core/tier_spec.py's.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel

from tiermesh.core import config_schema as schema
from tiermesh.core.canary_spec import CanarySpec, parse_canary
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.gates import reference_variant
from tiermesh.core.keys import DEFAULT_TIER
from tiermesh.core.tier_spec import (
    TierConfigError,
    TierSpec,
    check_tiers,
    parse_tiers,
    served_variants,
)

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


# What text input processing gives a job (core/text.py, and the Go front door's
# tokenizer): its compute inputs, and the annotation that tells the caller its text was cut.
TOKEN_IDS = "input_ids"
TOKEN_MASK = "attention_mask"
TRUNCATED = "truncated"
# The tokens of a job's texts, an annotation of its result when its caller asked for the
# whole text (`Controls.whole_text`: the OpenAI embeddings door's `usage`).
TEXT_TOKENS = "text_tokens"
# How the router's refusal of such a text begins.
TOO_LONG = "a text is longer than the model's"


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
    # Sizes the embedding may be cut to (its first d values, normalised again): a model
    # trained for it (Matryoshka); () = none.
    dimensions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One length bucket: requests up to `max_length` (tokens, or the size of the variable
    axis) batch together, with their own batch size and wait."""

    max_length: int  # 0 = unbounded (the single bucket of a model without buckets)
    max_batch_size: int
    max_batch_wait_ms: float
    # A batch that reaches the largest preferred size closes at once, and a batch is cut to
    # the largest preferred size that fits when more rows wait (Triton's convention).
    preferred_batch_sizes: tuple[int, ...] = ()


DEFAULT_YIELD_MS = 10.0


@dataclass(frozen=True, slots=True)
class SchedulingSpec:
    """How a worker shares its time between priority levels (1 = highest)."""

    # Relative share of batches per level under load, level 1 first.
    priority_weights: tuple[int, ...] = ()
    # A request waiting longer than its level's limit is served before any other.
    age_limit_ms: tuple[float, ...] = ()
    # While a higher level has traffic, a lower level's batch is cut to what computes
    # within this long (the worker's measured cost), so higher-level work waits for a lane
    # about that long at most. 0: batches are never cut.
    yield_ms: float = DEFAULT_YIELD_MS

    def weight(self, level: int) -> int:
        if level - 1 < len(self.priority_weights):
            return self.priority_weights[level - 1]
        return 1

    def age_limit(self, level: int) -> float:
        if level - 1 < len(self.age_limit_ms):
            return self.age_limit_ms[level - 1]
        return DEFAULT_AGE_LIMIT_MS


DEFAULT_AGE_LIMIT_MS = 1000.0
CASCADE_SCORES = ("top1_softmax",)


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """The gateway's response cache for one model: off unless a config turns it on."""

    enabled: bool = False
    ttl_s: float = 60.0
    max_entries: int = 10_000
    # Answers are cached per tenant unless the model's outputs are tenant-independent.
    shared_across_tenants: bool = False


@dataclass(frozen=True, slots=True)
class CascadeSpec:
    """Re-run an edge answer on center when the model is not confident enough about it.

    A cascade earns its cost when the edge runs a cheaper variant than center, and that is
    mixed variants (`tiers.mixed_variants: true`): the answer then depends on the edge's
    confidence, and says which variant gave it. Over one variant a cascade is allowed (the
    re-run answers the same) but only spends center time."""

    output: str
    threshold: float
    score: str = "top1_softmax"  # the only hook so far: the top class's softmax probability


@dataclass(frozen=True, slots=True)
class GenerationSpec:
    """A generative model (text in, text out, token by token): the router applies the chat
    template and tokenizes; a worker runs it with continuous batching (tiermesh.generate).

    `context_length` bounds prompt + max_new_tokens of one request; `max_new_tokens` is the
    most a request may ask for. The engine bounds: `max_sequences` running at once,
    `max_kv_tokens` reserved in the KV pool by all of them, `prefill_chunk` prompt tokens
    per sequence and step, `step_tokens` tokens fed per step."""

    tokenizer_file: str = "tokenizer.json"
    # chat template, stop token ids (written by `tiermesh models fetch`)
    chat_file: str = "chat.json"
    context_length: int = 2048
    max_new_tokens: int = 512
    max_prompt_bytes: int = 16_384
    # A request without a deadline of its own gets this one (answers take seconds, not ms).
    default_timeout_ms: int = 120_000
    max_sequences: int = 8
    max_kv_tokens: int = 8192
    prefill_chunk: int = 64
    step_tokens: int = 256


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    versions: tuple[ModelVersion, ...]
    max_batch_wait_ms: float = 2.0
    # Close a batch before its wait is over when the stream's measured arrival rate says
    # no further row is likely to come meanwhile (see worker/scheduler.py); false: always
    # wait the whole max_batch_wait_ms (Triton's max_queue_delay).
    adaptive_wait: bool = True
    # Entries waiting in one stream, and (when > 0) in all of the model's streams together.
    queue_bound: int = 1024
    model_queue_bound: int = 0
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
    # One per length bucket (at least one); see BucketSpec.
    buckets: tuple[BucketSpec, ...] = ()
    scheduling: SchedulingSpec = field(default_factory=SchedulingSpec)
    response_cache: CacheSpec = field(default_factory=CacheSpec)
    # Where the model is served, lightest first (edge before center); empty: center only,
    # with the default variant.
    tiers: tuple[TierSpec, ...] = ()
    # Tiers may serve different variants (`tiers: {mixed_variants: true, ...}`): answers then
    # depend on which tier serves a request. Off: a config whose tiers differ is refused.
    mixed_variants: bool = False
    cascade: CascadeSpec | None = None
    # The model whose queues, batching and weights this one uses ("" = itself).
    companion_of: str = ""
    # The version requests get when they name none and no rollout says otherwise ("" =
    # the latest); `canary:` says how a canary version is judged against it.
    stable_version: str = ""
    canary: CanarySpec = field(default_factory=CanarySpec)
    generation: GenerationSpec | None = None
    # Serve variants without a passing accuracy-gate record (`ungated: true`).
    ungated: bool = False
    # version -> the variants with a passing gate record there (core/gates.py; filled by
    # the repository from each version's gates.yaml). The reference variant always serves.
    servable: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def reference_variant(self) -> str:
        """The variant accuracy gates compare against (fp32, else the default)."""
        return reference_variant(self.variants, self.default_variant)

    def serves(self, variant: str, version: str = "") -> bool:
        """Whether `variant` may answer in `version` ("" = the default one): the reference
        always, another only with a passing gate record or `ungated: true`."""
        if self.ungated or variant == self.reference_variant:
            return True
        ver = self.version(version)
        return ver is not None and variant in self.servable.get(ver.version, frozenset())

    def servable_variants(self, version: str = "") -> list[str]:
        """The variants that may answer in `version` ("" = the default one)."""
        return [v for v in self.variants if self.serves(v, version)]

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
    def served_tiers(self) -> tuple[TierSpec, ...]:
        """Where the model is served: its tiers, else the default tier with the default
        variant."""
        return self.tiers or (TierSpec(DEFAULT_TIER, ""),)

    @property
    def tier_variants(self) -> dict[str, str]:
        """The variant each tier it is served on serves when the caller names none (tier
        name -> variant)."""
        return served_variants(self.served_tiers, self.default_variant)

    # The defaults of a request, each resolved here and nowhere else.

    def priority_level(self, requested: int) -> int:
        """The priority level a request runs at, Triton's convention: 0 is the model's
        default, 1 the highest level; ValueError (its words for the caller) out of range."""
        if requested == 0:
            return self.default_priority
        if not 1 <= requested <= self.priority_levels:
            raise ValueError(
                f"priority {requested} out of range: model '{self.name}' has levels "
                f"1..{self.priority_levels} (0 = default)"
            )
        return requested

    def variant_for(self, requested: str, tier: TierSpec | None = None) -> str:
        """The variant a request runs: the one it names, else its tier's, else the model's
        default."""
        return requested or (tier.variant if tier is not None else "") or self.default_variant

    def version_for(self, requested: str) -> str:
        """The version a request runs when no rollout places it: the one it names, else the
        stable one."""
        return requested or self.stable.version

    def tier(self, name: str) -> TierSpec | None:
        return next((t for t in self.tiers if t.name == name), None)

    def unit(self, version: str, variant: str) -> ComputeUnit:
        """The compute unit of one version and variant (a companion's is its host's)."""
        return ComputeUnit(self.queue_model, version, variant)

    @property
    def model_file(self) -> str:
        return self.variants[self.default_variant]

    @property
    def latest(self) -> ModelVersion:
        return max(self.versions, key=lambda v: int(v.version) if v.version.isdigit() else -1)

    @property
    def stable(self) -> ModelVersion:
        """The default version: `stable_version` when the config names one, else the latest."""
        named = self.stable_version and self.version(self.stable_version)
        return named or self.latest

    def version(self, version: str) -> ModelVersion | None:
        """The named version, or the default (stable) one when `version` is empty; None when
        unknown."""
        if not version:
            return self.stable
        return next((v for v in self.versions if v.version == version), None)

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    @property
    def bucket_count(self) -> int:
        return max(1, len(self.length_buckets))

    def bucket(self, index: int) -> BucketSpec:
        """The spec of bucket `index` (the model's own batching when it has no buckets)."""
        if self.buckets:
            return self.buckets[min(index, len(self.buckets) - 1)]
        return BucketSpec(0, max(self.max_batch_size, 1), self.max_batch_wait_ms)


def _tensors(raw: Sequence[schema.Tensor]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, t.datatype, tuple(t.dims)) for t in raw)


def _buckets(raw: schema.RawConfig) -> tuple[BucketSpec, ...]:
    """`length_buckets` as plain upper bounds (model batching for each) or as mappings with
    their own max_batch_size, max_batch_wait_ms and preferred_batch_sizes."""
    max_batch, wait_ms = max(raw.max_batch_size, 1), _batching(raw).max_batch_wait_ms
    return tuple(
        BucketSpec(item, max_batch, wait_ms)
        if isinstance(item, int)
        else BucketSpec(
            max_length=item.max_length,
            max_batch_size=max_batch if item.max_batch_size is None else item.max_batch_size,
            max_batch_wait_ms=wait_ms if item.max_batch_wait_ms is None else item.max_batch_wait_ms,
            preferred_batch_sizes=tuple(sorted(item.preferred_batch_sizes)),
        )
        for item in raw.length_buckets or ()
    )


def _batching(raw: schema.RawConfig) -> schema.Batching:
    return raw.batching or schema.Batching()


def _set(section: BaseModel | None) -> dict[str, Any]:
    """The keys a section gives (unset ones keep the dataclass's default)."""
    return {} if section is None else section.model_dump(exclude_none=True, exclude_unset=True)


def parse_config(raw: Any, where: str) -> ModelConfig:
    """Build a ModelConfig from the parsed YAML of config.yaml; raise RepositoryError naming
    `where` and what is wrong (a misspelt key: the section, and the keys allowed there)."""
    if not isinstance(raw, dict):
        raise RepositoryError(f"{where}: expected a mapping")
    try:
        cfg = _build(schema.validated(raw), raw)
    except (ValueError, TierConfigError) as exc:
        raise RepositoryError(f"{where}: {exc}") from None
    _check(cfg, where)
    return cfg


def _build(raw: schema.RawConfig, given: dict[str, Any]) -> ModelConfig:
    buckets = _buckets(raw)
    batching, scheduling = _batching(raw), raw.scheduling or schema.Scheduling()
    compute, tokenize = raw.compute, raw.tokenize
    variants = dict(raw.variants or {}) or {"fp32": raw.model_file}
    tiers, mixed_variants = parse_tiers(
        {
            str(name): _set(getattr(raw.tiers, str(name))) if name != "mixed_variants" else value
            for name, value in (given.get("tiers") or {}).items()
        }
    )
    return ModelConfig(
        name=raw.name,
        platform=raw.platform,
        max_batch_size=raw.max_batch_size,
        inputs=_tensors(raw.inputs),
        outputs=_tensors(raw.outputs),
        versions=tuple(
            ModelVersion(version, dict(files or {})) for version, files in raw.versions.items()
        ),
        max_batch_wait_ms=batching.max_batch_wait_ms,
        adaptive_wait=batching.adaptive_wait,
        queue_bound=raw.queue_bound,
        model_queue_bound=raw.model_queue_bound,
        priority_levels=raw.priority_levels,
        default_priority=raw.default_priority or raw.priority_levels,
        length_buckets=tuple(b.max_length for b in buckets),
        buckets=buckets,
        scheduling=SchedulingSpec(
            priority_weights=tuple(scheduling.priority_weights),
            age_limit_ms=tuple(scheduling.age_limit_ms),
            yield_ms=DEFAULT_YIELD_MS if scheduling.yield_ms is None else scheduling.yield_ms,
        ),
        response_cache=CacheSpec(**_set(raw.response_cache)),
        variants=variants,
        default_variant=raw.default_variant or next(iter(variants)),
        compute_inputs=_tensors(compute.inputs) if compute else (),
        compute_outputs=_tensors(compute.outputs) if compute else (),
        pad=dict(compute.pad) if compute else {},
        tokenize=TokenizeSpec(tokenize.tokenizer, tokenize.max_length, tokenize.max_text_bytes)
        if tokenize
        else None,
        pool=PoolSpec(raw.pool.source, raw.pool.mask, raw.pool.output, tuple(raw.pool.dimensions))
        if raw.pool
        else None,
        max_sequence=tokenize.max_length if tokenize else 0,
        cascade=CascadeSpec(**raw.cascade.model_dump()) if raw.cascade else None,
        generation=_generation(raw.generation) if raw.generation is not None else None,
        stable_version=raw.stable_version or "",
        canary=parse_canary(_set(raw.canary)),
        tiers=tiers,
        mixed_variants=mixed_variants,
        ungated=raw.ungated,
        # The repository adds the variants with a passing gate record (core/gates.py).
        servable={
            version: frozenset(variants)
            if raw.ungated
            else frozenset({reference_variant(variants, raw.default_variant or "")})
            for version in raw.versions
        },
    )


def _generation(raw: schema.Generation) -> GenerationSpec:
    values = _set(raw)
    names = {"tokenizer": "tokenizer_file", "chat": "chat_file"}
    return GenerationSpec(**{names.get(k, k): v for k, v in values.items()})


def _check_generation(cfg: ModelConfig, where: str) -> None:
    gen = cfg.generation
    if gen is None:
        return
    numbers = {
        "context_length": gen.context_length,
        "max_new_tokens": gen.max_new_tokens,
        "max_prompt_bytes": gen.max_prompt_bytes,
        "default_timeout_ms": gen.default_timeout_ms,
        "max_sequences": gen.max_sequences,
        "max_kv_tokens": gen.max_kv_tokens,
        "prefill_chunk": gen.prefill_chunk,
        "step_tokens": gen.step_tokens,
    }
    if bad := [k for k, v in numbers.items() if v < 1]:
        raise RepositoryError(f"{where}: generation {', '.join(bad)} must be >= 1")
    if gen.max_new_tokens >= gen.context_length:
        raise RepositoryError(f"{where}: generation max_new_tokens must be < context_length")
    # Any request the gateway accepts fits the pool alone, so none waits for ever.
    if gen.max_kv_tokens < gen.context_length:
        raise RepositoryError(f"{where}: generation max_kv_tokens must be >= context_length")
    if gen.step_tokens < gen.max_sequences:
        raise RepositoryError(f"{where}: generation step_tokens must be >= max_sequences")
    if (
        cfg.tiers
        or cfg.length_buckets
        or cfg.tokenize
        or cfg.pool
        or cfg.cascade
        or cfg.response_cache.enabled
    ):
        raise RepositoryError(
            f"{where}: a generative model has no tiers, length_buckets, tokenize, pool, "
            "cascade or response_cache (it runs on center, one bucket)"
        )
    if [(t.name, t.datatype) for t in cfg.inputs] != [("text_input", "BYTES")] or [
        (t.name, t.datatype) for t in cfg.outputs
    ] != [("text_output", "BYTES")]:
        raise RepositoryError(
            f"{where}: a generative model takes text_input (BYTES) and gives text_output (BYTES)"
        )


def _check(cfg: ModelConfig, where: str) -> None:
    _check_generation(cfg, where)
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
    for b in cfg.buckets:
        if not 1 <= b.max_batch_size <= max(cfg.max_batch_size, 1) or b.max_batch_wait_ms < 0:
            raise RepositoryError(
                f"{where}: bucket <= {b.max_length}: max_batch_size must be in "
                f"1..{max(cfg.max_batch_size, 1)} and max_batch_wait_ms >= 0"
            )
        if any(not 1 <= p <= b.max_batch_size for p in b.preferred_batch_sizes):
            raise RepositoryError(
                f"{where}: bucket <= {b.max_length}: preferred_batch_sizes must be in "
                f"1..{b.max_batch_size}"
            )
    sched = cfg.scheduling
    if any(w < 1 for w in sched.priority_weights) or any(a <= 0 for a in sched.age_limit_ms):
        raise RepositoryError(f"{where}: priority_weights must be >= 1, age_limit_ms > 0")
    if not 0 <= sched.yield_ms < math.inf:
        raise RepositoryError(f"{where}: scheduling yield_ms must be >= 0 (0: off)")
    try:
        check_tiers(cfg.tiers, cfg.variants, cfg.default_variant, cfg.mixed_variants)
    except TierConfigError as exc:
        raise RepositoryError(f"{where}: {exc}") from None
    if cfg.cascade is not None:
        if cfg.cascade.score not in CASCADE_SCORES:
            raise RepositoryError(f"{where}: cascade score must be one of {CASCADE_SCORES}")
        if cfg.cascade.output not in {t.name for t in cfg.runs_outputs}:
            raise RepositoryError(f"{where}: cascade output {cfg.cascade.output!r} unknown")
        if len(cfg.tiers) < 2:
            raise RepositoryError(f"{where}: a cascade needs two tiers (edge and center)")
    if cfg.response_cache.ttl_s <= 0 or cfg.response_cache.max_entries < 1:
        raise RepositoryError(f"{where}: response_cache ttl_s must be > 0, max_entries >= 1")
    if cfg.default_variant not in cfg.variants:
        raise RepositoryError(f"{where}: default_variant {cfg.default_variant!r} is not a variant")
    if not all(NAME.match(v) for v in cfg.variants):
        raise RepositoryError(f"{where}: variant names must match {NAME.pattern}")
    # Versions and variants are parts of a compute unit's name (core/keys.py).
    if not all(NAME.match(v.version) for v in cfg.versions):
        raise RepositoryError(f"{where}: version names must match {NAME.pattern}")
    if cfg.stable_version and cfg.version(cfg.stable_version) is None:
        raise RepositoryError(f"{where}: stable_version {cfg.stable_version!r} is not a version")
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
    if cfg.pool:
        _check_dimensions(where, cfg)


def companions(raw: Any, parent: ModelConfig, where: str) -> list[ModelConfig]:
    """The companion models a config declares: the parent's compute, another public input."""
    try:
        declared = schema.validated(raw).companions or []
    except ValueError as exc:
        raise RepositoryError(f"{where}: {exc}") from None
    out = []
    for item in declared:
        inputs = _tensors(item.inputs)
        cfg = replace(
            parent, name=item.name, inputs=inputs, tokenize=None, companion_of=parent.name
        )
        _check(cfg, where)
        if not _same_interface(inputs, parent.runs_inputs):
            raise RepositoryError(
                f"{where}: companion {item.name} must take the compute inputs (names, "
                "datatypes, ranks; a fixed dimension only where the compute one is dynamic "
                "or equal)"
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


def _check_dimensions(where: str, cfg: ModelConfig) -> None:
    """pool.dimensions: sizes under the pooled output's own (its last dim)."""
    assert cfg.pool is not None
    out = next(t for t in cfg.outputs if t.name == cfg.pool.output)
    size = out.dims[-1] if out.dims else 0
    bad = [d for d in cfg.pool.dimensions if not 0 < d < size]
    if bad:
        raise RepositoryError(
            f"{where}: pool.dimensions {bad} must lie between 1 and the output's size "
            f"({size}) less one"
        )


def bucket_for(length: int, bounds: tuple[int, ...]) -> int:
    """Index of the first bucket whose upper bound is >= length; the last bucket catches
    everything longer. With no bounds there is one bucket, 0."""
    if not bounds:
        return 0
    return min(bisect.bisect_left(bounds, length), len(bounds) - 1)
