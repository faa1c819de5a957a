"""Redis I/O of rollouts: state hashes, the change log, window buckets and the evaluator
lock. Every key comes from core/keys.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio as aioredis

from tiermesh.core import keys
from tiermesh.rollout.changes import Change
from tiermesh.rollout.state import RolloutState
from tiermesh.rollout.window import BUCKET_TTL_S, BucketId, WindowStats, stats_of

# Replace a state only if its rev is still the expected one, and log the change with it:
# both land or neither. KEYS: 1 state hash, 2 change log.
# ARGV: 1 expected rev ("0" = no state yet), 2 number of state fields (n), then n
# field/value pairs of the state, then the change log's field/value pairs. The log is
# trimmed past about CHANGE_LOG_MAX_LEN entries.
_REPLACE = f"""
local rev = redis.call('HGET', KEYS[1], 'rev') or '0'
if rev ~= ARGV[1] then
  return false
end
local n = tonumber(ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3, 2 + 2 * n))
return redis.call(
  'XADD', KEYS[2], 'MAXLEN', '~', '{keys.CHANGE_LOG_MAX_LEN}', '*', unpack(ARGV, 3 + 2 * n)
)
"""

# Take or keep the evaluator lock. KEYS: 1 lock; ARGV: 1 owner, 2 ttl ms.
_LOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""


def _str(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _text(raw: Mapping[Any, Any] | None) -> dict[str, str]:
    return {_str(k): _str(v) for k, v in (raw or {}).items()}


class RolloutStore:
    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._replace = redis.register_script(_REPLACE)
        self._lock = redis.register_script(_LOCK)

    async def state(self, model: str) -> RolloutState | None:
        raw = await self._redis.hgetall(keys.rollout_key(model))
        return RolloutState.from_fields(_text(raw)) if raw else None

    async def states(self, models: Sequence[str]) -> dict[str, RolloutState]:
        """The rollout state of every model that has one, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for model in models:
                pipe.hgetall(keys.rollout_key(model))
            raws = await pipe.execute()
        return {
            m: RolloutState.from_fields(_text(raw))
            for m, raw in zip(models, raws, strict=True)
            if raw
        }

    async def replace(self, expected_rev: int, new: RolloutState, change: Change) -> str | None:
        """Write `new` and log `change` if the stored state is still at `expected_rev`;
        the change log entry id, or None when somebody changed the state meanwhile."""
        state = [x for kv in new.to_fields().items() for x in kv]
        logged = [x for kv in change.to_fields().items() for x in kv]
        entry = await self._replace(
            keys=[keys.rollout_key(new.model), keys.CHANGE_LOG],
            args=[str(expected_rev), len(state) // 2, *state, *logged],
        )
        if entry is None:
            return None
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    async def changes(self, model: str = "", count: int = 20, scan: int = 1000) -> list[Change]:
        """The newest `count` changes (of `model`, when given), newest first, looked for
        among the last `scan` entries of the log."""
        out = []
        for entry_id, raw in await self._redis.xrevrange(keys.CHANGE_LOG, count=scan) or []:
            change = Change.from_fields(_str(entry_id), _text(raw))
            if not model or change.model == model:
                out.append(change)
                if len(out) >= count:
                    break
        return out

    async def window(self, model: str, version: str, seconds: range) -> WindowStats:
        async with self._redis.pipeline(transaction=False) as pipe:
            for second in seconds:
                pipe.hgetall(keys.window_key(model, version, second))
            raws = await pipe.execute()
        return stats_of(_text(raw) for raw in raws if raw)

    async def flush(
        self, ints: dict[BucketId, Counter[str]], floats: dict[BucketId, dict[str, float]]
    ) -> None:
        """Add drained WindowCounts to their buckets, in one round trip."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for (model, version, second), counts in ints.items():
                key = keys.window_key(model, version, second)
                for name, n in counts.items():
                    pipe.hincrby(key, name, n)
                for name, value in floats.get((model, version, second), {}).items():
                    pipe.hincrbyfloat(key, name, value)
                pipe.expire(key, BUCKET_TTL_S)
            await pipe.execute()

    async def hold_lock(self, owner: str, ttl_ms: int) -> bool:
        """Take the evaluator lock, or keep it when `owner` holds it already."""
        return bool(await self._lock(keys=[keys.ROLLOUT_LOCK], args=[owner, ttl_ms]))
