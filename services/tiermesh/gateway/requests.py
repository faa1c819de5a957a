"""What the gateway decides about one inference request, with no gRPC and no Redis.

`validate` checks a request against the model's metadata and raises MeshError naming the
problem; `effective_deadline_ns` and `priority_level` turn request parameters into values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tiermesh.core.controls import NO_CONTROLS, Controls
from tiermesh.core.errors import invalid, not_gated, shown, unknown_model
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.tensors import TensorData
from tiermesh.core.validation import check_inputs, check_outputs


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
    # The request parameters and door settings that say how the mesh treats it.
    controls: Controls = NO_CONTROLS
    # Generation parameters (max_new_tokens, temperature, ...) as the caller sent them
    # (int, float, str or bool); only a generative model reads them.
    parameters: Mapping[str, object] = field(default_factory=dict)
    # The OpenAI door's: a conversation for the chat template ((role, content) pairs), a
    # prompt without the template (a completion).
    messages: tuple[tuple[str, str], ...] = ()
    raw_prompt: bool = False


def find_model(repo: ModelRepository, name: str, version: str) -> ModelConfig:
    """The config of (name, version); NOT_FOUND (Triton's wording) when either is unknown."""
    cfg = repo.get(name)
    if cfg is None:
        raise unknown_model(name)
    if cfg.version(version) is None:
        raise unknown_model(name, version)
    return cfg


def validate(cfg: ModelConfig, req: InferRequest) -> None:
    """Raise INVALID_ARGUMENT for the first thing wrong with `req` for model `cfg`."""
    check_inputs(cfg, req.inputs)
    check_outputs(cfg, req.requested_outputs)


def variant_of(cfg: ModelConfig, requested: str, version: str = "") -> str:
    """The variant to run: the requested one, or the model's default. A variant without a
    passing accuracy-gate record in that version ("" = the default one) is refused."""
    if not requested:
        return cfg.variant_for("")
    if requested not in cfg.variants:
        known = ", ".join(sorted(cfg.variants))
        raise invalid(f"model '{cfg.name}' has no variant '{shown(requested)}' (variants: {known})")
    if not cfg.serves(requested, version):
        ver = cfg.version(version)
        shown_version = ver.version if ver is not None else version
        raise not_gated(cfg.name, requested, shown_version, cfg.servable_variants(version))
    return requested


def priority_level(cfg: ModelConfig, requested: int) -> int:
    """The level a request runs at (ModelConfig.priority_level); INVALID_ARGUMENT out of
    range."""
    try:
        return cfg.priority_level(requested)
    except ValueError as exc:
        raise invalid(str(exc)) from None


def controls_of(parameters: Mapping[str, object]) -> Controls:
    """The request's controls from its parameters as a door decoded them (only the names
    in core.controls.PARAMETERS are read); INVALID_ARGUMENT for a value of the wrong type."""
    try:
        return Controls.from_parameters(parameters)
    except ValueError as exc:
        raise invalid(str(exc)) from None


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
