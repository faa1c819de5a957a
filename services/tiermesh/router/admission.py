"""Bounded admission onto a work stream, atomically, in one Redis round trip.

A Lua script refuses when no live worker serves the (compute unit, tier); when the stream's
backlog (XLEN: workers XDEL entries once handed off) is at its bound, or all of the model's
streams together are at the model's bound; or when the queue ahead cannot drain before the
request's deadline at the drain rate workers measured. Otherwise it XADDs. Streams are never
trimmed by length. Every refusal is decided in Redis, at once: nobody waits to find out.

Enqueues are idempotent by request id: the entry id is remembered (until the request's
deadline), and a second admission of the same request (a gateway retrying after losing the
router's reply) answers `dup` with the first entry id instead of queueing it again.

A batch of jobs is one call of the script (one command, one round trip, every key named
once), which decides its items in order as separate calls would. On a Redis Cluster a call
covers the jobs of one model (its keys share a slot: core/keys.py); a batch of several
models' jobs is a call per model, made at once.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.admission_script import (
    ADMISSION_SCRIPT,
    REMEMBER_MARGIN_MS,
    REMEMBER_NO_DEADLINE_MS,
)
from tiermesh.core.redis_cluster import is_cluster, run_script
from tiermesh.router.tier_state import read_stream_states
from tiermesh.router.tiers import TierState

Outcome = Literal["ok", "dup", "noworker", "full", "modelfull", "late"]


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: Outcome
    # entry id when ok (or dup: queued before); the backlog when full or modelfull; the
    # estimated drain ms when late
    detail: str


@dataclass(frozen=True, slots=True)
class Enqueue:
    """One job to admit: its entry bytes, where it goes and the bounds it must fit."""

    stream: keys.StreamKey
    bound: int
    job: bytes
    trace_context: Mapping[str, str]
    request_id: str
    model_streams: Sequence[keys.StreamKey] = ()
    model_bound: int = 0
    ms_left: int = -1  # -1: no deadline


class Admitter:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._script = redis.register_script(ADMISSION_SCRIPT)
        self._cluster = is_cluster(redis)

    async def stream_states(self, streams: Sequence[keys.StreamKey]) -> dict[str, TierState]:
        """The state of each stream's tier, by stream name, in one round trip."""
        return await read_stream_states(self._redis, streams)

    async def admit(
        self,
        stream: keys.StreamKey,
        bound: int,
        job: bytes,
        trace_context: Mapping[str, str],
        *,
        request_id: str,
        model_streams: Sequence[keys.StreamKey] = (),
        model_bound: int = 0,
        ms_left: int = -1,
    ) -> Admission:
        """XADD `job` to `stream` unless refused or already queued; raises redis errors
        to the caller."""
        item = Enqueue(
            stream, bound, job, trace_context, request_id, model_streams, model_bound, ms_left
        )
        return (await self.admit_many([item]))[0]

    async def admit_many(self, items: Sequence[Enqueue]) -> list[Admission]:
        """Admit every item, each as `admit` does, in one script call (one round trip and
        one command for a whole batch of jobs). Raises redis errors to the caller."""
        if not items:
            return []
        if self._cluster:
            slots: dict[str, list[int]] = defaultdict(list)
            for i, item in enumerate(items):
                slots[keys.model_tag(item.stream.unit.model)].append(i)
            if len(slots) > 1:
                parts = await asyncio.gather(
                    *(self._call([items[i] for i in at]) for at in slots.values())
                )
                out: dict[int, Admission] = {}
                for at, part in zip(slots.values(), parts, strict=True):
                    out.update(zip(at, part, strict=True))
                return [out[i] for i in range(len(items))]
        return await self._call(items)

    async def _call(self, items: Sequence[Enqueue]) -> list[Admission]:
        """One call of the script for `items`."""
        script_keys, args = _script_call(items)
        # The script is loaded again where Redis lost it (restarted, flushed); on a cluster
        # the call returns once a replica has the jobs.
        reply = await run_script(self._redis, self._script, script_keys, args)
        decoded = [x.decode() if isinstance(x, bytes) else str(x) for x in reply]
        return [
            Admission(outcome, detail)  # type: ignore[arg-type]
            for outcome, detail in zip(decoded[::2], decoded[1::2], strict=True)
        ]


def _script_call(items: Sequence[Enqueue]) -> tuple[list[str], list[Any]]:
    """KEYS (each key once) and ARGV of the admission script for a batch of items."""
    index: dict[str, int] = {}

    def at(key: str) -> int:
        if key not in index:
            index[key] = len(index) + 1  # Lua counts from 1
        return index[key]

    args: list[Any] = [len(items), keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD]
    for item in items:
        stream = item.stream
        remember_ms = (
            item.ms_left + REMEMBER_MARGIN_MS if item.ms_left >= 0 else REMEMBER_NO_DEADLINE_MS
        )
        args += (
            at(stream.name),
            at(keys.workers_key(stream.unit, stream.tier)),
            at(keys.rate_key(stream.unit, stream.tier)),
            at(keys.enqueued_key(stream.unit.model, item.request_id)),
            item.bound,
            item.model_bound,
            keys.rate_field(stream.bucket),
            item.ms_left,
            remember_ms,
            item.job,
            item.trace_context.get("traceparent", ""),
            item.trace_context.get("tracestate", ""),
            0,  # no guard: the router's placement is its own
            len(item.model_streams),
            *(at(s.name) for s in item.model_streams),
        )
    return list(index), args
