"""Bounded admission onto a work stream, atomically, in one Redis round trip.

A Lua script refuses when no live worker serves the (compute unit, tier); when the stream's
backlog (XLEN: workers XDEL entries once handed off) is at its bound, or all of the model's
streams together are at the model's bound; or when the queue ahead cannot drain before the
request's deadline at the drain rate workers measured. Otherwise it XADDs. Streams are never
trimmed by length. Every refusal is decided in Redis, at once: nobody waits to find out.

Enqueues are idempotent by request id: the entry id is remembered (until the request's
deadline), and a second admission of the same request (a gateway retrying after losing the
router's reply) answers `dup` with the first entry id instead of queueing it again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from tiermesh.core import keys
from tiermesh.router.tier_state import read_stream_states
from tiermesh.router.tiers import TierState

# KEYS: 1 target stream, 2 workers zset, 3 rate hash, 4 enqueued key of the request,
#       5.. every stream of the model.
# ARGV: 1 stream bound, 2 model bound (0 = none), 3 rate field, 4 ms left (-1 = no deadline),
#       5 how long to remember the enqueue (ms), 6.. the entry's field/value pairs.
_SCRIPT = """
local seen = redis.call('GET', KEYS[4])
if seen then
  return {'dup', seen}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZCOUNT', KEYS[2], now_ms, '+inf') == 0 then
  return {'noworker', '0'}
end
local backlog = redis.call('XLEN', KEYS[1])
if backlog >= tonumber(ARGV[1]) then
  return {'full', tostring(backlog)}
end
local model_bound = tonumber(ARGV[2])
if model_bound > 0 then
  local total = 0
  for i = 5, #KEYS do total = total + redis.call('XLEN', KEYS[i]) end
  if total >= model_bound then
    return {'modelfull', tostring(total)}
  end
end
local left_ms = tonumber(ARGV[4])
if left_ms >= 0 and backlog > 0 then
  local rate = tonumber(redis.call('HGET', KEYS[3], ARGV[3]) or '0')
  if rate and rate > 0 then
    local drain_ms = math.floor(backlog / rate * 1000)
    if drain_ms > left_ms then
      return {'late', tostring(drain_ms)}
    end
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 6))
redis.call('SET', KEYS[4], id, 'PX', ARGV[5])
return {'ok', id}
"""

Outcome = Literal["ok", "dup", "noworker", "full", "modelfull", "late"]
# How long an enqueue is remembered past the request's deadline (or at all, without one).
REMEMBER_MARGIN_MS = 5_000
REMEMBER_NO_DEADLINE_MS = 600_000


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
        self._script = redis.register_script(_SCRIPT)

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
        """Admit every item, each as `admit` does, in one pipeline (one round trip for a
        whole batch of jobs). Raises redis errors to the caller."""
        if not items:
            return []
        for attempt in (1, 2):
            async with self._redis.pipeline(transaction=False) as pipe:
                for item in items:
                    pipe.evalsha(self._script.sha, *_script_call(item))
                replies = await pipe.execute(raise_on_error=False)
            if not any(isinstance(r, NoScriptError) for r in replies):
                break
            if attempt == 2:
                raise next(r for r in replies if isinstance(r, NoScriptError))
            # Redis restarted (or was flushed) since the script was loaded: none of these
            # ran, so load it and send them again.
            await self._redis.script_load(_SCRIPT)
        out = []
        for r in replies:
            if isinstance(r, Exception):
                raise r
            outcome, detail = (x.decode() if isinstance(x, bytes) else str(x) for x in r)
            out.append(Admission(outcome, detail))  # type: ignore[arg-type]
        return out


def _script_call(item: Enqueue) -> list[Any]:
    """numkeys, KEYS and ARGV of the admission script for one item."""
    remember_ms = (
        item.ms_left + REMEMBER_MARGIN_MS if item.ms_left >= 0 else REMEMBER_NO_DEADLINE_MS
    )
    stream = item.stream
    script_keys = [
        stream.name,
        keys.workers_key(stream.model, stream.tier),
        keys.rate_key(stream.model, stream.tier),
        keys.enqueued_key(item.request_id),
        *(s.name for s in item.model_streams),
    ]
    return [
        len(script_keys),
        *script_keys,
        item.bound,
        item.model_bound,
        keys.rate_field(stream.bucket),
        item.ms_left,
        remember_ms,
        keys.JOB_FIELD,
        item.job,
        keys.TRACEPARENT_FIELD,
        item.trace_context.get("traceparent", ""),
        keys.TRACESTATE_FIELD,
        item.trace_context.get("tracestate", ""),
    ]
