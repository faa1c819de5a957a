"""What each tier of a model looks like right now, read from Redis in one round trip:
live workers (heartbeats), the backlog of the stream a request would join, its drain rate."""

from __future__ import annotations

import time
from collections.abc import Sequence

import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.core.keys import StreamKey
from tiermesh.router.tiers import TierState


async def read_stream_states(
    redis: aioredis.Redis, streams: Sequence[StreamKey]
) -> dict[str, TierState]:
    """The state of each stream's tier (live workers, the stream's backlog and drain rate),
    by stream name, in one round trip. Raises redis errors."""
    now_ms = int(time.time() * 1000)
    async with redis.pipeline(transaction=False) as pipe:
        for s in streams:
            pipe.zcount(keys.workers_key(s.unit, s.tier), now_ms, "+inf")
            pipe.xlen(s.name)
            pipe.hget(keys.rate_key(s.unit, s.tier), keys.rate_field(s.bucket))
        replies = await pipe.execute()
    states = {}
    for i, s in enumerate(streams):
        live, backlog, rate = replies[3 * i : 3 * i + 3]
        states[s.name] = TierState(
            alive=int(live) > 0, backlog=int(backlog), rate=float(rate) if rate else 0.0
        )
    return states
