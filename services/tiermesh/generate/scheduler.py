"""Continuous-batching decisions for generative serving: which sequences leave, which waiting
requests join, and how many prompt tokens each sequence still prefilling feeds this step.

Pure and synchronous: `plan_step` reads the running sequences, the waiting requests, the time
the caller passes in and the limits, and returns a `StepPlan`; it changes nothing. The engine
applies the plan and runs the model.

Pool-full policy (the KV pool is bounded in tokens, `Limits.max_kv_tokens`; each sequence
reserves `len(prompt) + max_new_tokens` when admitted and keeps that reservation until it
leaves, so a running sequence can never run out of room):

- Running sequences are never preempted. When the pool (or the sequence bound) is full,
  waiting requests wait.
- Waiting requests are considered by priority (1 highest), then arrival. Admission stops at
  the first request that does not fit: nothing of lower rank is let past it, so a waiting
  high-priority request is the first admitted as soon as enough room frees.
- A waiting request whose deadline has passed is dropped with reason "deadline" without being
  run; one whose own reservation exceeds the whole pool is rejected with "too_large".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tiermesh.generate.inputs import Sampling

GREEDY = Sampling()  # what a request gets unless it asks otherwise

LeaveReason = Literal["stop", "length", "deadline"]
RejectReason = Literal["deadline", "too_large"]


@dataclass(frozen=True)
class GenRequest:
    """One generation request. `priority` 1 is the highest; `deadline_ns` 0 means none;
    `stop_ids`: generating one of these ends the sequence (the token is still emitted)."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    priority: int = 1
    deadline_ns: int = 0
    arrived_ns: int = 0
    stop_ids: frozenset[int] = frozenset()
    sampling: Sampling = GREEDY

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"request {self.request_id!r}: empty prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_new_tokens must be >= 1")

    @property
    def reserved_tokens(self) -> int:
        """KV-pool tokens the request holds from admission until it leaves."""
        return len(self.prompt) + self.max_new_tokens


@dataclass
class SeqState:
    """A running sequence, as the engine keeps it. `prefilled`: prompt tokens already fed to
    the model; `kv_len`: tokens in its KV cache (prompt fed + generated tokens fed back)."""

    request: GenRequest
    generated: list[int] = field(default_factory=list)
    prefilled: int = 0
    kv_len: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.request.prompt)


@dataclass(frozen=True)
class Limits:
    """Bounds of one engine. `step_tokens` is the tokens fed in one model run (decode tokens
    count 1 each, prefill chunks share the rest); it must be at least `max_sequences`, so
    every running sequence can always move."""

    max_sequences: int = 8
    max_kv_tokens: int = 8192
    prefill_chunk: int = 64
    step_tokens: int = 256

    def __post_init__(self) -> None:
        if min(self.max_sequences, self.max_kv_tokens, self.prefill_chunk) < 1:
            raise ValueError("limits must be positive")
        if self.step_tokens < self.max_sequences:
            raise ValueError("step_tokens must be >= max_sequences")


@dataclass(frozen=True)
class Leave:
    """A running sequence that leaves now, and why."""

    request_id: str
    reason: LeaveReason


@dataclass(frozen=True)
class Reject:
    """A waiting request removed without being run, and why."""

    request_id: str
    reason: RejectReason


@dataclass(frozen=True)
class StepPlan:
    """What one step does: running sequences that leave, waiting requests rejected, waiting
    requests admitted (in rank order), and `feed`: every sequence that runs this step mapped
    to how many tokens it feeds, 1 when decoding, its prefill chunk while prefilling. A
    sequence still prefilling that got no budget is absent from `feed`."""

    leave: tuple[Leave, ...] = ()
    reject: tuple[Reject, ...] = ()
    admit: tuple[str, ...] = ()
    feed: Mapping[str, int] = field(default_factory=dict)


def leave_reason(seq: SeqState, now_ns: int) -> LeaveReason | None:
    """Why `seq` must leave now, or None: its last token is a stop token, it has generated
    max_new_tokens, or its deadline has passed."""
    req = seq.request
    if seq.generated and seq.generated[-1] in req.stop_ids:
        return "stop"
    if len(seq.generated) >= req.max_new_tokens:
        return "length"
    if req.deadline_ns and now_ns >= req.deadline_ns:
        return "deadline"
    return None


def _rank(req: GenRequest) -> tuple[int, int]:
    return (req.priority, req.arrived_ns)


def plan_step(
    running: Sequence[SeqState], waiting: Sequence[GenRequest], now_ns: int, limits: Limits
) -> StepPlan:
    """The plan of the next step at time `now_ns`. Sequences that leave free their sequence
    slot and KV reservation for this same step's admissions."""
    leave: list[Leave] = []
    staying: list[SeqState] = []
    for seq in running:
        reason = leave_reason(seq, now_ns)
        if reason is None:
            staying.append(seq)
        else:
            leave.append(Leave(seq.request_id, reason))

    reject: list[Reject] = []
    admit: list[GenRequest] = []
    used = sum(s.request.reserved_tokens for s in staying)
    count = len(staying)
    blocked = False
    for req in sorted(waiting, key=_rank):  # stable: equal ranks keep submission order
        if req.deadline_ns and now_ns >= req.deadline_ns:
            reject.append(Reject(req.request_id, "deadline"))
        elif req.reserved_tokens > limits.max_kv_tokens:
            reject.append(Reject(req.request_id, "too_large"))
        elif blocked:
            continue
        elif count < limits.max_sequences and used + req.reserved_tokens <= limits.max_kv_tokens:
            admit.append(req)
            used += req.reserved_tokens
            count += 1
        else:
            blocked = True  # nothing ranked lower goes past it

    feed = _feed(staying, admit, limits)
    return StepPlan(tuple(leave), tuple(reject), tuple(r.request_id for r in admit), feed)


def _feed(staying: list[SeqState], admit: list[GenRequest], limits: Limits) -> dict[str, int]:
    """Decode tokens first (1 each, always within budget since step_tokens >=
    max_sequences), then prefill chunks by priority and arrival from what is left."""
    feed: dict[str, int] = {}
    prefilling: list[tuple[GenRequest, int]] = []
    for seq in staying:
        if seq.prefilling:
            prefilling.append((seq.request, seq.prefilled))
        else:
            feed[seq.request_id] = 1
    prefilling.extend((req, 0) for req in admit)
    budget = limits.step_tokens - len(feed)
    for req, done in sorted(prefilling, key=lambda p: _rank(p[0])):
        chunk = min(limits.prefill_chunk, len(req.prompt) - done, budget)
        if chunk > 0:
            feed[req.request_id] = chunk
            budget -= chunk
    return feed
