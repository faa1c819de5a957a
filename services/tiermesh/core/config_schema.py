"""The shape of a model's config.yaml, as pydantic models: every key known, every value
typed. A misspelt key is refused with the section it is in and the keys allowed there
(`tiermesh models schema` prints the JSON Schema for editors).

This is the file's grammar only; what the values must mean together (a default variant
that exists, buckets that ascend, ...) is core/model_config.py's, which builds its frozen
dataclasses from a validated `RawConfig`.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from tiermesh.core.tensors import DATATYPES

# YAML reads `"1":` as a string and `1:` as an int; both name version 1.
Key = Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, int | float) else v)]


def _keys(cls: type[BaseModel]) -> list[str]:
    """The keys a section accepts: field names, or their YAML spellings where they differ."""
    out: list[str] = []
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        out += list(alias.choices) if isinstance(alias, AliasChoices) else [name]  # type: ignore[arg-type]
    return sorted(str(k) for k in out)


class Section(BaseModel):
    """A mapping of config.yaml: unknown keys refused, naming the allowed ones."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        allowed = _keys(cls)
        if unknown := [str(k) for k in data if str(k) not in allowed]:
            hints = [
                f"{k!r} (did you mean {close[0]!r}?)"
                if (close := difflib.get_close_matches(k, allowed, n=1))
                else repr(k)
                for k in unknown
            ]
            raise ValueError(f"unknown key {', '.join(hints)}; allowed keys: {', '.join(allowed)}")
        return data


class Tensor(Section):
    name: str
    datatype: str
    # Without the batch dimension when the model batches; -1 is dynamic.
    dims: list[int]

    @field_validator("datatype")
    @classmethod
    def _datatype(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(f"unknown datatype {value!r} (datatypes: {', '.join(DATATYPES)})")
        return value

    @field_validator("dims")
    @classmethod
    def _dims(cls, value: list[int]) -> list[int]:
        if not all(d > 0 or d == -1 for d in value):
            raise ValueError(f"dims {value} must be positive or -1")
        return value


Tensors = Annotated[list[Tensor], Field(min_length=1)]


class Compute(Section):
    """What onnxruntime runs, when it differs from what clients send and get."""

    inputs: Tensors
    outputs: Tensors
    # Inputs padded to the longest in a batch, with this value.
    pad: dict[str, int] = {}


class Tokenize(Section):
    tokenizer: str
    max_length: int
    max_text_bytes: int = 16_384


class Pool(Section):
    source: str
    mask: str
    output: str
    # Sizes the embedding may be cut to (a Matryoshka-trained model), for the OpenAI door's
    # `dimensions`; none: the model's whole size only.
    dimensions: list[int] = []


class Bucket(Section):
    max_length: int
    # Unset: the model's own.
    max_batch_size: int | None = None
    max_batch_wait_ms: float | None = None
    preferred_batch_sizes: list[int] = []


class Batching(Section):
    max_batch_wait_ms: float = 2.0
    adaptive_wait: StrictBool = True


class Scheduling(Section):
    priority_weights: list[int] = []
    age_limit_ms: list[float] = []
    yield_ms: float | None = None


class ResponseCache(Section):
    enabled: StrictBool = False
    ttl_s: float = 60.0
    max_entries: int = 10_000
    shared_across_tenants: StrictBool = False


class Cascade(Section):
    output: str
    threshold: float
    score: str = "top1_softmax"


class Provider(Section):
    """An execution provider with its options (onnxruntime's provider options)."""

    name: str
    options: dict[str, str | int | float | bool] = {}


class Tier(Section):
    variant: str = ""
    max_cost: int = 0
    # Which onnxruntime execution providers this tier's workers ask for, in order (a
    # worker's own TIERMESH_EXECUTION_PROVIDERS wins); empty: CPU.
    execution_providers: list[str | Provider] = []


class Tiers(Section):
    edge: Tier | None = None
    center: Tier | None = None
    mixed_variants: StrictBool = False


class Generation(Section):
    tokenizer: str = Field("tokenizer.json", validation_alias=AliasChoices("tokenizer"))
    chat: str = Field("chat.json", validation_alias=AliasChoices("chat"))
    context_length: int | None = None
    max_new_tokens: int | None = None
    max_prompt_bytes: int | None = None
    default_timeout_ms: int | None = None
    max_sequences: int | None = None
    max_kv_tokens: int | None = None
    prefill_chunk: int | None = None
    step_tokens: int | None = None


class Canary(Section):
    window_s: float | None = None
    min_requests: int | None = None
    max_error_rate: float | None = None
    max_p99_ratio: float | None = None
    p99_floor_ms: float | None = None
    min_cosine: float | None = None
    min_pairs: int | None = None
    mirror_fraction: float | None = None


class Companion(Section):
    """Another public interface over the model's queues, batching and weights."""

    name: str
    inputs: Tensors


class RawConfig(Section):
    """A model's config.yaml."""

    name: str
    platform: str = "onnxruntime_onnx"
    # 0: the model does not batch (dims are the whole shape).
    max_batch_size: int = 0
    inputs: Tensors
    outputs: Tensors
    compute: Compute | None = None
    tokenize: Tokenize | None = None
    pool: Pool | None = None
    companions: list[Companion] | None = None
    # variant -> model file of each version (default: {fp32: model_file}).
    variants: dict[Key, str] | None = None
    model_file: str = "model.onnx"
    default_variant: str | None = None
    # Serve variants that have no passing accuracy-gate record (logged at start).
    ungated: StrictBool = False
    tiers: Tiers | None = None
    # Upper bounds of the length buckets, plain or with their own batching.
    length_buckets: list[int | Bucket] | None = None
    batching: Batching | None = None
    queue_bound: int = 1024
    model_queue_bound: int = 0
    priority_levels: int = 2
    # Unset or 0: the lowest level.
    default_priority: int | None = None
    scheduling: Scheduling | None = None
    response_cache: ResponseCache | None = None
    cascade: Cascade | None = None
    generation: Generation | None = None
    stable_version: Key | None = None
    canary: Canary | None = None
    # version -> {file: sha256, or `provenance` for one recorded by `tiermesh models fetch`}
    versions: dict[Key, dict[str, Key] | None]


def validated(raw: Any) -> RawConfig:
    """`raw` (parsed YAML) as a RawConfig; raises ValueError with one line per problem."""
    try:
        return RawConfig.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """pydantic's errors as `section.key: problem`, one per line, without its URLs."""
    lines = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"])
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "missing required key"
        elif err["type"] not in ("value_error", "extra_forbidden"):
            message += f" (got {err['input']!r})"
        lines.append(f"{where}: {message}" if where else message)
    return "; ".join(dict.fromkeys(lines))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of config.yaml."""
    schema = RawConfig.model_json_schema()
    schema["title"] = "tiermesh model config.yaml"
    return schema
