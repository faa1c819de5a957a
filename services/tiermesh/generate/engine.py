"""Continuous batching over the ONNX decoder of `tiermesh.convert.llama`: every `step` applies
`plan_step` and makes at most one onnxruntime run, of the kind the plan names: prompt chunks
of the sequences prefilling, or one token for each sequence decoding, whatever their cache
lengths. Never both in one run: every decoding row would be padded out to the longest
prefill chunk (8 rows x a 40-token chunk cost ~490 ms against ~35 ms for the decode-only
run). One run per step, not a prefill and a decode run per step: a step's tokens reach the
caller when the step ends, so a request arriving while others decode gets its first token
one prefill run after the run in flight, not a prefill plus a decode run later
(issue 23: SmolLM2, a 16-token answer beside 8 running answers, benchmarks/generate_mesh.py).

Batch layout of a run (P = longest cache, T = most tokens fed by one sequence):

    attention_mask row:  [0 .. 0 | 1 .. 1 (its cache) | 1 .. 1 (its tokens) | 0 .. 0]
                          left pad to P                                       right pad to T

Caches are left-padded to P with zeros (masked out), the new tokens right-padded to T (masked
out, their logits ignored); `position_ids` count from each sequence's own cache length. After
the run each sequence keeps its slice of `present.*`, padding stripped. Synchronous: a
serving loop calls `step` from a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import onnxruntime as ort

from tiermesh.generate.sampling import choose, generator
from tiermesh.generate.scheduler import (
    GenRequest,
    Limits,
    RunKind,
    SeqState,
    leave_reason,
    plan_step,
)

EventKind = Literal["token", "done", "rejected"]

# Chooses the next token from the logits [vocab] of a sequence's last fed position. None
# (the default): each request's own `sampling` (greedy, or top-p at a temperature with its
# seed; generate/sampling.py).
TokenChooser = Callable[[np.ndarray, SeqState], int]


@dataclass(frozen=True)
class Event:
    """What a step produced for one request: a generated token (`value` its id), the end of
    a sequence that ran ("done", `value` the reason: stop, length, deadline) or a request
    removed without running ("rejected", `value` the reason: deadline, too_large)."""

    request_id: str
    kind: EventKind
    value: int | str


class Engine:
    """The running and waiting sequences of one decoder session and their KV caches."""

    def __init__(
        self,
        session: ort.InferenceSession,
        stop_ids: Collection[int],
        limits: Limits,
        clock_ns: Callable[[], int] = time.time_ns,
        choose: TokenChooser | None = None,
    ) -> None:
        self._session = session
        self._stop_ids = frozenset(stop_ids)
        self._limits = limits
        self._clock_ns = clock_ns
        self._choose = choose or self._sample
        # request id -> its random stream (seeded by its sampling.seed) while it runs
        self._rngs: dict[str, np.random.Generator] = {}
        self._past_names = [
            i.name for i in session.get_inputs() if i.name.startswith("past_key_values.")
        ]
        self._outputs = [
            "logits",
            *(n.replace("past_key_values.", "present.") for n in self._past_names),
        ]
        shapes = {i.name: i.shape for i in session.get_inputs()}
        # [n_kv_heads, head_dim] of every cache tensor, for the zeros of padding.
        self._kv_dims = {n: (int(shapes[n][1]), int(shapes[n][3])) for n in self._past_names}
        self._waiting: list[GenRequest] = []
        self._running: list[SeqState] = []
        # request id -> cache name -> [n_kv_heads, kv_len, head_dim]
        self._cache: dict[str, dict[str, np.ndarray]] = {}
        # The last decode run's sequences and its present arrays: while the same sequences
        # decode again, those arrays are the next past as they are (no re-stacking).
        self._decoded: tuple[tuple[str, ...], list[np.ndarray]] | None = None
        self._last_run: RunKind | None = None  # what the previous step ran

    # -- intake ---------------------------------------------------------------------------

    def submit(self, request: GenRequest) -> None:
        """Queue `request`; the engine's stop ids are added to its own. Admission happens in
        a later `step`. Raises ValueError for a request id already known."""
        rid = request.request_id
        if any(r.request_id == rid for r in self._waiting) or any(
            s.request_id == rid for s in self._running
        ):
            raise ValueError(f"request {rid!r} already submitted")
        self._waiting.append(replace(request, stop_ids=request.stop_ids | self._stop_ids))

    def cancel(self, request_id: str) -> bool:
        """Forget the request at once, waiting or running: its slot, reservation and cache are
        free for the next step. No event follows. False when it is unknown (or finished)."""
        for i, req in enumerate(self._waiting):
            if req.request_id == request_id:
                del self._waiting[i]
                return True
        for seq in self._running:
            if seq.request_id == request_id:
                self._release(request_id)
                return True
        return False

    # -- state ----------------------------------------------------------------------------

    @property
    def reserved_tokens(self) -> int:
        """KV-pool tokens reserved by running sequences (bounded by `max_kv_tokens`)."""
        return sum(s.request.reserved_tokens for s in self._running)

    @property
    def cached_tokens(self) -> int:
        """Tokens actually held in KV caches."""
        return sum(s.kv_len for s in self._running)

    @property
    def running(self) -> list[str]:
        return [s.request_id for s in self._running]

    @property
    def waiting(self) -> list[str]:
        return [r.request_id for r in self._waiting]

    def idle(self) -> bool:
        return not self._running and not self._waiting

    # -- one step -------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Apply one plan and make at most one model run (prefill chunks or decodes).
        Events come in this order: leaves decided by the plan (deadline), rejections,
        tokens; a sequence that generates its last token (stop or max_new_tokens) gets its
        "done" in the same step, right after the token, and is freed at once."""
        now = self._clock_ns()
        plan = plan_step(self._running, self._waiting, now, self._limits, self._last_run)
        self._last_run = plan.run
        events: list[Event] = []
        for leave in plan.leave:
            self._release(leave.request_id)
            events.append(Event(leave.request_id, "done", leave.reason))
        rejected = {r.request_id for r in plan.reject}
        events.extend(Event(r.request_id, "rejected", r.reason) for r in plan.reject)
        admitted = set(plan.admit)
        by_id = {r.request_id: r for r in self._waiting}
        for rid in plan.admit:  # rank order
            self._running.append(SeqState(by_id[rid]))
            self._cache[rid] = self._empty_cache()
        self._waiting = [r for r in self._waiting if r.request_id not in admitted | rejected]
        batch = [(s, plan.feed[s.request_id]) for s in self._running if s.request_id in plan.feed]
        if not batch:
            return events
        for seq, token in self._run(batch):
            seq.generated.append(token)
            events.append(Event(seq.request_id, "token", token))
            reason = leave_reason(seq, now)
            if reason in ("stop", "length"):
                self._release(seq.request_id)
                events.append(Event(seq.request_id, "done", reason))
        return events

    def _release(self, request_id: str) -> None:
        self._decoded = None  # its cache lives in those arrays too
        self._running = [s for s in self._running if s.request_id != request_id]
        self._cache.pop(request_id, None)
        self._rngs.pop(request_id, None)

    def _sample(self, logits: np.ndarray, seq: SeqState) -> int:
        sampling = seq.request.sampling
        rng = self._rngs.get(seq.request_id)
        if rng is None:
            rng = self._rngs[seq.request_id] = generator(sampling)
        return choose(logits, sampling, rng)

    def _empty_cache(self) -> dict[str, np.ndarray]:
        return {n: np.zeros((h, 0, d), np.float32) for n, (h, d) in self._kv_dims.items()}

    def _run(self, batch: list[tuple[SeqState, int]]) -> list[tuple[SeqState, int]]:
        """One model run over `batch` (sequence, tokens it feeds); updates each sequence's
        cache and counters, returns the sequences that generated a token, and the token."""
        rows = len(batch)
        longest_past = max(s.kv_len for s, _ in batch)
        longest_new = max(n for _, n in batch)
        ids = np.zeros((rows, longest_new), np.int64)
        positions = np.zeros((rows, longest_new), np.int64)
        mask = np.zeros((rows, longest_past + longest_new), np.int64)
        members = tuple(s.request_id for s, _ in batch)
        decoding = not any(s.prefilling for s, _ in batch)
        # Each row's cache is right-aligned at longest_past, so after a decode run of the
        # same rows the presents are laid out as this run's past already.
        reused = self._decoded[1] if self._decoded and self._decoded[0] == members else None
        past = (
            dict(zip(self._past_names, reused, strict=True))
            if decoding and reused is not None
            else {
                n: np.zeros((rows, h, longest_past, d), np.float32)
                for n, (h, d) in self._kv_dims.items()
            }
        )
        for b, (seq, n) in enumerate(batch):
            ids[b, :n] = _tokens_to_feed(seq, n)
            positions[b] = seq.kv_len + np.arange(longest_new)
            mask[b, longest_past - seq.kv_len : longest_past + n] = 1
            if decoding and reused is not None:
                continue
            cache = self._cache[seq.request_id]
            for name, array in past.items():
                array[b, :, longest_past - seq.kv_len :] = cache[name]
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past}
        values = self._session.run(self._outputs, feeds)
        logits, presents = values[0], values[1:]
        if decoding:
            self._decoded = (members, presents)

        produced: list[tuple[SeqState, int]] = []
        for b, (seq, n) in enumerate(batch):
            start = longest_past - seq.kv_len
            self._cache[seq.request_id] = {
                name: present[b, :, start : longest_past + n]
                for name, present in zip(self._past_names, presents, strict=True)
            }
            seq.kv_len += n
            if seq.prefilling:
                seq.prefilled += n
                if seq.prefilling:
                    continue  # more prompt to feed: no token yet
            produced.append((seq, self._choose(logits[b, n - 1], seq)))
        return produced


def _tokens_to_feed(seq: SeqState, n: int) -> list[int]:
    if seq.prefilling:
        return list(seq.request.prompt[seq.prefilled : seq.prefilled + n])
    return [seq.generated[-1]]
