"""What the gateway decides about one inference request, with no gRPC and no Redis.

`validate` checks a request against the model's metadata and raises MeshError naming the
problem; `effective_deadline_ns` and `priority_level` turn request parameters into values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tiermesh.core.errors import invalid, shown, shown_shape, unknown_model
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.tensors import BYTES, TensorData, element_count, split_bytes, validate_raw


@dataclass(frozen=True, slots=True)
class InferRequest:
    model: str
    version: str
    inputs: tuple[TensorData, ...]
    client_request_id: str = ""
    requested_outputs: tuple[str, ...] = ()
    priority: int = 0
    # tritonclient's `timeout` parameter, microseconds; None when absent.
    timeout_us: int | None = None
    # The `variant` request parameter (fp32, int8, ...); "" = the model's default.
    variant: str = ""
    # The `sticky_key` request parameter: requests with one key see one version of a model
    # during a canary rollout ("" = the tenant's, else the request id's).
    sticky_key: str = ""
    # Generation parameters (max_new_tokens, temperature, ...) as the caller sent them
    # (int, float, str or bool); only a generative model reads them.
    parameters: Mapping[str, object] = field(default_factory=dict)


def find_model(repo: ModelRepository, name: str, version: str) -> ModelConfig:
    """The config of (name, version); NOT_FOUND (Triton's wording) when either is unknown."""
    cfg = repo.get(name)
    if cfg is None:
        raise unknown_model(name)
    if cfg.version(version) is None:
        raise unknown_model(name, version)
    return cfg


# Called by a door with each input's name, datatype and shape before it reads the input's
# contents: the data plane's check_tensor against the model, so that a tensor the model would
# refuse is never built.
Screen = Callable[[str, str, tuple[int, ...]], None]


def no_screen(name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """A Screen that lets every tensor through (validate checks it later)."""


# Elements the gateway walks one by one (typed contents, BYTES elements), ~40 ns each: at
# most ~40 ms of the event loop a tensor. Fixed-size tensors sent raw have no such limit.
MAX_LISTED_ELEMENTS = 1 << 20


def check_tensor(cfg: ModelConfig, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """What can be said of an input from its name, datatype and shape alone, before its
    contents are read (or, for typed contents, even built): raise INVALID_ARGUMENT."""
    spec = cfg.input(name)
    if spec is None:
        known = ", ".join(i.name for i in cfg.inputs)
        raise invalid(f"unknown input '{shown(name)}' for model '{cfg.name}' (inputs: {known})")
    if datatype != spec.datatype:
        raise invalid(
            f"input '{shown(name)}': datatype {shown(datatype)} does not match the model's "
            f"{spec.datatype}"
        )
    _check_shape(cfg, name, shape, spec.dims)
    if datatype == BYTES and (count := element_count(shape)) > MAX_LISTED_ELEMENTS:
        raise invalid(
            f"input '{shown(name)}': {count} BYTES elements, over the limit of "
            f"{MAX_LISTED_ELEMENTS}"
        )


def _check_shape(
    cfg: ModelConfig, name: str, shape: tuple[int, ...], expected_dims: tuple[int, ...]
) -> None:
    if any(d < 1 for d in shape):
        raise invalid(
            f"input '{shown(name)}': every dimension must be positive, got {shown_shape(shape)}"
        )
    dims = shape
    if cfg.max_batch_size > 0:
        if len(shape) != len(expected_dims) + 1:
            raise invalid(
                f"input '{shown(name)}': rank {len(shape)} does not match the model's rank "
                f"{len(expected_dims) + 1} (shape {[-1, *expected_dims]})"
            )
        if shape[0] > cfg.max_batch_size:
            raise invalid(
                f"input '{shown(name)}': batch size {shape[0]} exceeds max_batch_size "
                f"{cfg.max_batch_size}"
            )
        dims = shape[1:]
    elif len(shape) != len(expected_dims):
        raise invalid(
            f"input '{shown(name)}': rank {len(shape)} does not match the model's rank "
            f"{len(expected_dims)} (shape {list(expected_dims)})"
        )
    for i, (got, want) in enumerate(zip(dims, expected_dims, strict=True)):
        if want != -1 and got != want:
            raise invalid(
                f"input '{shown(name)}': dimension {i + (cfg.max_batch_size > 0)} is {got}, "
                f"the model expects {want}"
            )
    if cfg.max_sequence:
        offset = 1 if cfg.max_batch_size > 0 else 0
        for i, want in enumerate(expected_dims):
            if want == -1 and shape[i + offset] > cfg.max_sequence:
                raise invalid(
                    f"input '{shown(name)}': dimension {i + offset} is {shape[i + offset]}, "
                    f"longer than the model's {cfg.max_sequence}"
                )


def validate(cfg: ModelConfig, req: InferRequest) -> None:
    """Raise INVALID_ARGUMENT for the first thing wrong with `req` for model `cfg`."""
    seen: set[str] = set()
    for t in req.inputs:
        check_tensor(cfg, t.name, t.datatype, t.shape)
        if t.name in seen:
            raise invalid(f"input '{shown(t.name)}' given more than once")
        seen.add(t.name)
        validate_raw(t.name, t.datatype, t.shape, t.raw)
        _check_text_limit(cfg, t)
    missing = [i.name for i in cfg.inputs if i.name not in seen]
    if missing:
        raise invalid(f"missing input(s) {', '.join(missing)} for model '{cfg.name}'")
    if cfg.max_batch_size > 0 and len({t.shape[0] for t in req.inputs}) > 1:
        raise invalid("inputs disagree on the batch size (dimension 0)")
    outputs = {o.name for o in cfg.outputs}
    for name in req.requested_outputs:
        if name not in outputs:
            raise invalid(f"unknown output '{shown(name)}' for model '{cfg.name}'")


def _check_text_limit(cfg: ModelConfig, t: TensorData) -> None:
    """A tokenized model's limit on the byte size of each text."""
    if cfg.tokenize is not None and t.datatype == BYTES:
        limit = cfg.tokenize.max_text_bytes
        for i, item in enumerate(split_bytes(t.raw, element_count(t.shape), t.name)):
            if len(item) > limit:
                raise invalid(
                    f"input '{shown(t.name)}': text element {i} is {len(item)} bytes, over the "
                    f"limit of {limit}"
                )


def variant_of(cfg: ModelConfig, requested: str) -> str:
    """The variant to run: the requested one, or the model's default."""
    if not requested:
        return cfg.default_variant
    if requested not in cfg.variants:
        known = ", ".join(sorted(cfg.variants))
        raise invalid(f"model '{cfg.name}' has no variant '{shown(requested)}' (variants: {known})")
    return requested


def priority_level(cfg: ModelConfig, requested: int) -> int:
    """Triton's convention: 0 means the model's default; 1 is the highest level."""
    if requested == 0:
        return cfg.default_priority
    if not 1 <= requested <= cfg.priority_levels:
        raise invalid(
            f"priority {requested} out of range: model '{cfg.name}' has levels "
            f"1..{cfg.priority_levels} (0 = default)"
        )
    return requested


# The longest a request may wait, whatever its `timeout` parameter or gRPC deadline says.
MAX_WAIT_NS = 24 * 3600 * 1_000_000_000


def effective_deadline_ns(
    now_ns: int,
    grpc_remaining_s: float | None,
    timeout_us: int | None,
    default_timeout_ms: int,
) -> int:
    """The earliest of the gRPC deadline and the `timeout` parameter, as absolute unix ns.

    A `timeout` of 0 means none, as in Triton. With neither, the gateway's default timeout
    applies so that nothing waits forever. Nothing waits longer than MAX_WAIT_NS either:
    a `timeout` of 2**64-1 us (valid for the protocol) would not even fit the int64
    nanoseconds the deadline travels as.
    """
    candidates = [now_ns + MAX_WAIT_NS]
    if grpc_remaining_s is not None:
        candidates.append(now_ns + int(grpc_remaining_s * 1e9))
    if timeout_us is not None:
        if timeout_us < 0:
            raise invalid(f"timeout {timeout_us} us is negative")
        if timeout_us > 0:
            candidates.append(now_ns + timeout_us * 1000)
    if len(candidates) == 1:
        candidates.append(now_ns + default_timeout_ms * 1_000_000)
    return min(candidates)
