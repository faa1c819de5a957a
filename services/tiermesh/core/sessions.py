"""The ONNX session factory: every onnxruntime session the mesh and its tools create comes
from `open_session`, with `session_options` and the execution providers asked for.

A provider request is a value: an ordered tuple of `ProviderSpec` (onnxruntime's name, or a
short alias, and its provider options). Which providers a session is given is a pure
decision (`select_providers`, from what onnxruntime says is available); a provider that is
missing, or that onnxruntime silently replaced (it does so when one fails to initialise, e.g.
CUDA libraries absent), is refused with one line naming the way out, or replaced by CPU with
a warning when the fallback setting says `cpu`. Never silently.

onnxruntime itself is imported only when a session is made: the gateway and router read
tiers' provider requests (core/tier_spec.py) through this module and never load it.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import structlog

from tiermesh.core.compute_unit import ComputeUnit

if TYPE_CHECKING:
    import onnxruntime as ort

log = structlog.get_logger("tiermesh.sessions")

CPU = "CPUExecutionProvider"
# Short alias -> onnxruntime's name: the providers a request may name.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "cuda": "CUDAExecutionProvider",
        "tensorrt": "TensorrtExecutionProvider",
        "openvino": "OpenVINOExecutionProvider",
        "rocm": "ROCMExecutionProvider",
        "migraphx": "MIGraphXExecutionProvider",
        "coreml": "CoreMLExecutionProvider",
        "cpu": CPU,
    }
)
# Providers whose CUDA and cuDNN libraries may come from pip packages (the gpu extra).
_CUDA_PROVIDERS = frozenset({"CUDAExecutionProvider", "TensorrtExecutionProvider"})
# The setting that lets a worker fall back to CPU, as the errors name it.
FALLBACK_SETTING = "TIERMESH_PROVIDER_FALLBACK"
Fallback = Literal["refuse", "cpu"]


class ProviderError(ValueError):
    """A provider request that cannot be read: an unknown name, a malformed item."""


class ProviderUnavailable(RuntimeError):
    """A provider asked for that this onnxruntime does not have or could not initialise,
    and the fallback setting is `refuse`. Its message is one line."""


def provider_name(name: str) -> str:
    """onnxruntime's name for `name` (its own name or a short alias, any case)."""
    key = name.strip().lower()
    for alias, full in ALIASES.items():
        if key in (alias, full.lower()):
            return full
    raise ProviderError(
        f"unknown execution provider {name!r}: use one of {', '.join(ALIASES)} "
        f"or onnxruntime's names ({', '.join(ALIASES.values())})"
    )


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One execution provider asked for: onnxruntime's name (an alias is turned into it)
    and its provider options (strings, as onnxruntime takes them)."""

    name: str
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", provider_name(self.name))
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __hash__(self) -> int:
        return hash((self.name, tuple(sorted(self.options.items()))))


ProviderRequest = tuple[ProviderSpec, ...]
CPU_ONLY: ProviderRequest = (ProviderSpec(CPU),)


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """What a worker asks of a unit's sessions: the providers (empty: CPU) and what to do
    when one is missing or fails to initialise."""

    request: ProviderRequest = ()
    fallback: Fallback = "refuse"


def _option_value(key: str, value: object) -> str:
    if isinstance(value, bool):  # before int: a bool is one
        return "1" if value else "0"
    if isinstance(value, str | int | float):
        return str(value)
    raise ProviderError(f"provider option {key}: expected a string or number, got {value!r}")


def parse_provider(item: object) -> ProviderSpec:
    """A provider from a name, or from a mapping `{name: ..., options: {...}}` (option
    values are turned into strings; true/false into "1"/"0")."""
    if isinstance(item, str):
        return ProviderSpec(item)
    if isinstance(item, Mapping):
        extra = set(item) - {"name", "options"}
        if extra:
            raise ProviderError(f"provider {dict(item)!r}: unknown keys {sorted(map(str, extra))}")
        name, options = item.get("name"), item.get("options") or {}
        if not isinstance(name, str):
            raise ProviderError(f"provider {dict(item)!r}: `name` must be a string")
        if not isinstance(options, Mapping):
            raise ProviderError(f"provider {name}: `options` must be a mapping")
        return ProviderSpec(name, {str(k): _option_value(str(k), v) for k, v in options.items()})
    raise ProviderError(
        f"expected a provider name or {{name, options}}, got {type(item).__name__} {item!r}"
    )


def parse_providers(raw: object) -> ProviderRequest:
    """A request from a list of names or `{name, options}` mappings, or from a string: a
    comma list of names, or a JSON list (TIERMESH_EXECUTION_PROVIDERS). None or "": ()."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ProviderError(f"execution providers: not a JSON list ({exc})") from None
        else:
            raw = [part for part in (p.strip() for p in text.split(",")) if part]
    if not isinstance(raw, list | tuple):
        raise ProviderError(f"execution providers: expected a list, got {raw!r}")
    request = tuple(parse_provider(item) for item in raw)
    names = [s.name for s in request]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ProviderError(f"execution providers: {', '.join(twice)} listed more than once")
    return request


def names(request: Sequence[ProviderSpec]) -> list[str]:
    return [s.name for s in request]


def select_providers(
    requested: Sequence[ProviderSpec], available: Sequence[str], fallback: Fallback
) -> ProviderRequest:
    """The providers to give onnxruntime for `requested` (empty: CPU only), in its order,
    given onnxruntime's available ones. A missing one: ProviderUnavailable with `refuse`;
    with `cpu`, the missing ones are dropped, CPU comes last, and a warning says so."""
    request = tuple(requested) or CPU_ONLY
    missing = [s.name for s in request if s.name not in available]
    if not missing:
        return request
    if fallback != "cpu":
        raise ProviderUnavailable(
            f"execution provider {', '.join(missing)} is not available in this onnxruntime "
            f"(available: {', '.join(available) or 'none'}); install a build that has it, "
            f"or set {FALLBACK_SETTING}=cpu to run on {CPU} instead"
        )
    kept = tuple(s for s in request if s.name in available)
    chosen = kept if CPU in names(kept) else (*kept, ProviderSpec(CPU))
    log.warning(
        "execution provider unavailable: falling back",
        requested=names(request),
        missing=missing,
        using=names(chosen),
    )
    return chosen


def check_provider(session: Any, selected: Sequence[ProviderSpec], fallback: Fallback) -> str:
    """The provider `session` actually got first (`get_providers()[0]`). onnxruntime gives
    the next one silently when the first fails to initialise: that is refused like a
    missing provider, or (fallback `cpu`) accepted with a warning."""
    got = list(session.get_providers())
    actual = got[0] if got else ""
    wanted = selected[0].name
    if actual == wanted:
        return actual
    if fallback != "cpu":
        raise ProviderUnavailable(
            f"onnxruntime could not initialise {wanted} and gave {actual or 'nothing'} "
            f"instead (its log says why; session providers: {', '.join(got)}); fix that, "
            f"or set {FALLBACK_SETTING}=cpu to run on {actual or CPU}"
        )
    log.warning(
        "execution provider failed to initialise: falling back",
        requested=names(selected),
        using=got,
    )
    return actual


def session_options(intra_op_threads: int) -> ort.SessionOptions:
    """Options of every onnxruntime session the mesh creates."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    # Spinning threads make timings on small shared machines vary several-fold.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class Opened(NamedTuple):
    session: Any  # onnxruntime.InferenceSession
    provider: str  # the provider it actually got first


def open_session(
    model: str | Path | bytes,
    options: ort.SessionOptions,
    providers: Sequence[ProviderSpec] = (),
    *,
    fallback: Fallback = "refuse",
    external: Mapping[str, bytes] | None = None,
    unit: ComputeUnit | None = None,
) -> Opened:
    """A session of `model` (a path, or the model's bytes with its external data in
    `external`: nothing read from disk) on the providers asked for (empty: CPU). Raises
    ProviderUnavailable as `select_providers` and `check_provider` do. `unit`: the compute
    unit a worker opens it for; the session is then logged with what it got."""
    import onnxruntime as ort

    if external:
        keys = list(external)
        buffers = [external[k] for k in keys]
        options.add_external_initializers_from_files_in_memory(
            keys, buffers, [len(b) for b in buffers]
        )
    selected = select_providers(providers, ort.get_available_providers(), fallback)
    if _CUDA_PROVIDERS & set(names(selected)):
        _preload_cuda()
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(
        source, options, providers=[(s.name, dict(s.options)) for s in selected]
    )
    provider = check_provider(session, selected, fallback)
    if unit is not None:
        log.info(
            "onnx session created",
            unit=str(unit),
            requested=names(providers or CPU_ONLY),
            provider=provider,
        )
    return Opened(session, provider)


@functools.cache
def _preload_cuda() -> None:
    """CUDA and cuDNN from the nvidia pip packages the gpu extra installs (onnxruntime does
    not look there by itself); absent, onnxruntime's CUDA provider fails to initialise and
    `check_provider` says so. What preload_dlls prints goes to the log instead of stdout."""
    import onnxruntime as ort

    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        try:
            preload()
        except Exception as exc:  # a CPU build, a missing folder: the session check decides
            log.warning("could not preload CUDA libraries", error=str(exc))
    if printed.getvalue().strip():
        log.warning("preloading CUDA libraries", output=printed.getvalue().strip())
