"""Bounded admission onto a work stream, atomically, in one Redis round trip.

A Lua script refuses when no live worker serves the (model, tier), or when the stream's
backlog (XLEN: workers XDEL entries once handed off) is at the bound; otherwise it XADDs.
Streams are never trimmed by length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis.asyncio as aioredis

from tiermesh.core import keys

_SCRIPT = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZCOUNT', KEYS[2], now_ms, '+inf') == 0 then
  return {'noworker', '0'}
end
local backlog = redis.call('XLEN', KEYS[1])
if backlog >= tonumber(ARGV[1]) then
  return {'full', tostring(backlog)}
end
local id = redis.call('XADD', KEYS[1], '*', ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
return {'ok', id}
"""


@dataclass(frozen=True, slots=True)
class Admission:
    outcome: Literal["ok", "noworker", "full"]
    # entry id when ok, backlog size when full
    detail: str


class Admitter:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._script = redis.register_script(_SCRIPT)

    async def admit(
        self, stream: keys.StreamKey, bound: int, job: bytes, trace_context: dict[str, str]
    ) -> Admission:
        """XADD `job` to `stream` unless refused; raises redis errors to the caller."""
        raw = await self._script(
            keys=[stream.name, keys.workers_key(stream.model, stream.tier)],
            args=[
                bound,
                keys.JOB_FIELD,
                job,
                keys.TRACEPARENT_FIELD,
                trace_context.get("traceparent", ""),
                keys.TRACESTATE_FIELD,
                trace_context.get("tracestate", ""),
            ],
        )
        outcome, detail = (x.decode() if isinstance(x, bytes) else str(x) for x in raw)
        return Admission(outcome, detail)  # type: ignore[arg-type]
