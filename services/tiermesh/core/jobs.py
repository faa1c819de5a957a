"""The domain form of a request travelling through the mesh, and of its outcome."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from tiermesh.core.controls import NO_CONTROLS, Controls
from tiermesh.core.tensors import TensorData

T = TypeVar("T")


def _replacer(cls: type[T]) -> Callable[[T, dict[str, Any]], T]:
    """`dataclasses.replace` for a frozen dataclass whose fields are all set by __init__ and
    that has no __post_init__: the copy is made field by field instead of through __init__'s
    keyword arguments, at half the cost (the request path makes several a request)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not all(f.init for f in fields) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: a copy must go through __init__")
    names = tuple(f.name for f in fields)
    known = frozenset(names)
    new, put = object.__new__, object.__setattr__

    def replace(obj: T, changes: dict[str, Any]) -> T:
        if not changes.keys() <= known:
            raise TypeError(f"{cls.__name__} has no field {sorted(changes.keys() - known)}")
        out = new(cls)
        for name in names:
            put(out, name, changes[name] if name in changes else getattr(obj, name))
        return out

    return replace


@dataclass(frozen=True, slots=True)
class Timing:
    """Wall-clock instants (unix ns) of one request; 0 where not reached (yet).

    received (gateway) -> routed (router got it) -> enqueued (XADD, after input processing)
    -> dequeued (worker read it) -> batch_start -> batch_end -> postprocessed -> delivered
    (back at the gateway).
    """

    received_ns: int = 0
    routed_ns: int = 0
    dequeued_ns: int = 0
    batch_start_ns: int = 0
    batch_end_ns: int = 0
    postprocessed_ns: int = 0
    delivered_ns: int = 0
    enqueued_ns: int = 0

    def with_(self, **instants: int) -> Timing:
        return _replace_timing(self, instants)

    def breakdown_ms(self, responded_ns: int) -> dict[str, float]:
        """The stages in milliseconds, for a response built at `responded_ns`.

        Consecutive stages share their boundaries, so the parts add up to delivered -
        received; total_ms (responded - received) adds the gateway's last step. A stage
        whose ends were not both reached (a cache hit) is left out.
        """
        stages = (
            ("preprocess_ms", self.received_ns, self.enqueued_ns),
            ("queue_ms", self.enqueued_ns, self.dequeued_ns),
            ("batch_wait_ms", self.dequeued_ns, self.batch_start_ns),
            ("compute_ms", self.batch_start_ns, self.batch_end_ns),
            ("postprocess_ms", self.batch_end_ns, self.postprocessed_ns),
            ("delivery_ms", self.postprocessed_ns, self.delivered_ns),
            ("total_ms", self.received_ns, responded_ns),
        )
        return {name: (end - start) / 1e6 for name, start, end in stages if start and end}


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a request to a generative model asks for, as checked by the gateway
    (tiermesh.generate.inputs). `seed` is always set: the caller's, or one drawn from the
    request id, so a redelivered request samples the same tokens again. `stream`: the caller
    reads pieces as they are produced (partial results), not only the whole answer."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stream: bool = False
    # A conversation as (role, content) pairs, rendered by the chat template in place of the
    # prompt as one user message (the OpenAI chat door); () for a prompt.
    messages: tuple[tuple[str, str], ...] = ()
    # The prompt as it is, without the chat template (the OpenAI completions door).
    raw_prompt: bool = False


@dataclass(frozen=True, slots=True)
class Job:
    request_id: str
    model: str
    inputs: tuple[TensorData, ...]
    gateway: str
    deadline_ns: int = 0
    client_request_id: str = ""
    tenant: str = ""
    version: str = ""
    variant: str = ""
    priority: int = 0
    bucket: int = 0
    tier: str = ""
    requested_outputs: tuple[str, ...] = ()
    timing: Timing = field(default_factory=Timing)
    trace_context: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: GenerationRequest | None = None
    controls: Controls = NO_CONTROLS

    @property
    def rows(self) -> int:
        """Rows this request contributes to a batch (its batch dimension)."""
        return self.inputs[0].batch if self.inputs else 1

    def with_(self, **fields: Any) -> Job:
        return _replace_job(self, fields)


@dataclass(frozen=True, slots=True)
class JobResult:
    request_id: str
    model: str
    gateway: str
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    outputs: tuple[TensorData, ...] = ()
    client_request_id: str = ""
    version: str = ""
    variant: str = ""
    tier: str = ""
    priority: int = 0
    bucket: int = 0
    batch_size: int = 0
    worker: str = ""
    timing: Timing = field(default_factory=Timing)
    trace_context: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    aux: tuple[TensorData, ...] = ()
    # A piece of a generative answer (outputs: the text since the previous piece, starting
    # at character `text_offset` of the answer); the final result is not partial.
    partial: bool = False
    text_offset: int = 0
    # The W3C traceparent of the worker's batch span, where the worker traces ("" = none).
    batch_traceparent: str = ""
    # Delivered by its worker, not postprocess: no output step was left to run.
    direct: bool = False
    controls: Controls = NO_CONTROLS

    @classmethod
    def for_job(cls, job: Job, **fields: object) -> JobResult:
        """A result that carries the identity, timing and trace context of `job`."""
        base: dict[str, object] = dict(
            request_id=job.request_id,
            client_request_id=job.client_request_id,
            model=job.model,
            version=job.version,
            variant=job.variant,
            gateway=job.gateway,
            tier=job.tier,
            priority=job.priority,
            bucket=job.bucket,
            timing=job.timing,
            trace_context=job.trace_context,
            annotations=job.annotations,
            controls=job.controls,
        )
        base.update(fields)
        return cls(**base)  # type: ignore[arg-type]

    def with_(self, **fields: Any) -> JobResult:
        return _replace_result(self, fields)


_replace_timing = _replacer(Timing)
_replace_job = _replacer(Job)
_replace_result = _replacer(JobResult)
