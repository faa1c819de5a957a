"""Continuous-batching decisions for generative serving: which sequences leave, which waiting
requests join, and what the next model run feeds.

Pure and synchronous: `plan_step` reads the running sequences, the waiting requests, the time
the caller passes in, the kind of the previous run and the limits, and returns a `StepPlan`;
it changes nothing. The engine applies the plan and makes the one model run it names.

A step is one model run, of one of two kinds (mixing them would pad every decoding row out
to the longest prompt chunk):

- prefill: prompt chunks of the sequences still prefilling, by priority and arrival, as many
  as fit `Limits.step_tokens` counted with padding (rows x the longest chunk); a sequence
  whose prompt is all fed gets its first token from this run.
- decode: one token for every sequence whose prompt is fed.

A prefill run comes whenever a prompt waits for one, except right after another prefill
run while sequences decode: then it is decode's turn. So a request that arrives while
others decode has its first chunk fed at the next run boundary, or the one after (when the
run in flight is a prefill), and decoding sequences go at most one prefill run (bounded by
`step_tokens`) without a token: time to first token stays near its solo figure while long
answers run, and no answer stalls behind a stream of prompts.

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
RunKind = Literal["prefill", "decode"]
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
    """Bounds of one engine. `step_tokens` bounds the tokens one model run feeds, padding
    included: a decode run feeds 1 per decoding sequence, a prefill run its rows x its
    longest chunk. It must be at least `max_sequences`, so every decoding sequence can
    always move in one run."""

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
    requests admitted (in rank order), the kind of its model run (None: nothing to run), and
    `feed`: every sequence in that run mapped to how many tokens it feeds, 1 in a decode
    run, its prompt chunk in a prefill run. Running sequences absent from `feed` wait."""

    leave: tuple[Leave, ...] = ()
    reject: tuple[Reject, ...] = ()
    admit: tuple[str, ...] = ()
    run: RunKind | None = None
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
    running: Sequence[SeqState],
    waiting: Sequence[GenRequest],
    now_ns: int,
    limits: Limits,
    last_run: RunKind | None = None,
) -> StepPlan:
    """The plan of the next step at time `now_ns`, after a run of kind `last_run` (None
    before the first). Sequences that leave free their sequence slot and KV reservation for
    this same step's admissions."""
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

    decoding = [s.request_id for s in staying if not s.prefilling]
    prefilling = [(s.request, s.prefilled) for s in staying if s.prefilling]
    prefilling.extend((req, 0) for req in admit)
    kind = next_run(bool(prefilling), bool(decoding), last_run)
    feed: dict[str, int] = {}
    if kind == "prefill":
        feed = prefill_chunks(prefilling, limits)
    elif kind == "decode":
        feed = dict.fromkeys(decoding, 1)
    return StepPlan(tuple(leave), tuple(reject), tuple(r.request_id for r in admit), kind, feed)


def next_run(prompts: bool, decodes: bool, last_run: RunKind | None) -> RunKind | None:
    """The kind of the next run: prefill while a prompt waits for one, except right after a
    prefill run while sequences decode (their turn); decode otherwise; None with neither."""
    if prompts and not (decodes and last_run == "prefill"):
        return "prefill"
    return "decode" if decodes else None


def prefill_chunks(prefilling: Sequence[tuple[GenRequest, int]], limits: Limits) -> dict[str, int]:
    """The prompt chunk of each sequence in a prefill run, given (request, prompt tokens
    already fed): by priority and arrival, each up to `prefill_chunk`, while rows x the
    longest chunk stays within `step_tokens`. A later row's chunk is cut to the longest so
    far when that lets it fit without more padding; the first row always gets a chunk."""
    feed: dict[str, int] = {}
    width = 0  # the longest chunk so far: every row is padded to it
    for req, done in sorted(prefilling, key=lambda p: _rank(p[0])):
        chunk = min(limits.prefill_chunk, len(req.prompt) - done, limits.step_tokens)
        rows = len(feed) + 1
        if rows * max(width, chunk) > limits.step_tokens:
            chunk = min(chunk, width)
            if rows * width > limits.step_tokens:
                break
        feed[req.request_id] = chunk
        width = max(width, chunk)
    return feed
