"""Per-tenant rate limit and in-flight cap, shared by every gateway replica through Redis.

One Lua script decides atomically: drop the tenant's in-flight entries whose deadline has
passed (those of a gateway that died), refuse when the cap is reached, else take a token
from the bucket (limits.py's arithmetic) and record the request as in flight until its
deadline. `release` removes the entry when the call ends, on every path.

Fails closed: when Redis cannot be reached the request is refused UNAVAILABLE, because
admitting it would lift every tenant's limits for as long as Redis is away.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog
from redis.exceptions import BusyLoadingError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tiermesh.core import keys
from tiermesh.core.errors import MeshError, exhausted, unavailable
from tiermesh.core.tenants import Tenant
from tiermesh.gateway.limits import idle_ms_to_full

log = structlog.get_logger("tiermesh.gateway")

# Redis could not be asked: refuse, the caller may retry (on this or another replica).
REDIS_DOWN = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, OSError)

# Refusal kinds, the `kind` label of the quota-refusal counter.
RATE = "rate"
IN_FLIGHT = "in_flight"

# KEYS[1] bucket hash, KEYS[2] in-flight sorted set.
# ARGV[1] now in ms ('' = Redis's own clock, one clock for all replicas), ARGV[2] requests/s,
# ARGV[3] burst, ARGV[4] in-flight cap, ARGV[5] request id, ARGV[6] its deadline (ms),
# ARGV[7] retry-after (ms) when the cap is reached, ARGV[8] bucket TTL (ms).
# Returns {admitted (0|1), refusal kind, retry-after ms}. Numbers are stored with
# string.format: Lua would print them with 14 significant digits.
_ACQUIRE = """
local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local rate = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then
  return {0, 'in_flight', tonumber(ARGV[7])}
end
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ms')
local tokens = tonumber(state[1])
local last = tonumber(state[2])
if tokens == nil or last == nil then
  tokens = burst
  last = now
end
tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
if tokens < 1 then
  return {0, 'rate', math.max(1, math.ceil((1 - tokens) * 1000 / rate))}
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens - 1),
           'ms', string.format('%d', math.max(now, last)))
redis.call('PEXPIRE', KEYS[1], ARGV[8])
local deadline = tonumber(ARGV[6])
redis.call('ZADD', KEYS[2], string.format('%d', deadline), ARGV[5])
local ttl = math.max(deadline - now, 0) + 1000
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], string.format('%d', ttl))
end
return {1, '', 0}
"""


class QuotaRefused(MeshError):
    """RESOURCE_EXHAUSTED with retry-after, and which limit (for the metrics)."""

    def __init__(self, tenant: str, kind: str, retry_after_ms: int) -> None:
        what = "rate limit" if kind == RATE else "in-flight cap"
        err = exhausted(f"tenant '{tenant}' is over its {what}; retry later", retry_after_ms)
        super().__init__(err.code, err.message, retry_after_ms=retry_after_ms)
        self.tenant = tenant
        self.kind = kind


@dataclass(frozen=True, slots=True)
class Held:
    """A request counted in its tenant's in-flight set; give it to `release`."""

    tenant: str
    request_id: str


class Quota:
    """Built once in __main__ on the gateway's Redis client. `clock_ms` is for tests: None
    uses Redis's clock, which every replica shares."""

    def __init__(
        self,
        redis: aioredis.Redis,
        in_flight_retry_after_ms: int,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._redis = redis
        self._acquire = redis.register_script(_ACQUIRE)
        self._retry_ms = in_flight_retry_after_ms
        self._clock_ms = clock_ms

    async def acquire(self, tenant: Tenant, request_id: str, deadline_ms: int) -> Held:
        """Called once per request after it was authorized. Returns the hold to release;
        raises QuotaRefused over a limit, UNAVAILABLE when Redis cannot be reached."""
        now = "" if self._clock_ms is None else str(self._clock_ms())
        try:
            reply = await self._acquire(
                keys=[keys.quota_rate_key(tenant.name), keys.quota_in_flight_key(tenant.name)],
                args=[
                    now,
                    repr(float(tenant.requests_per_s)),
                    tenant.burst,
                    tenant.max_in_flight,
                    request_id,
                    deadline_ms,
                    self._retry_ms,
                    idle_ms_to_full(tenant.requests_per_s, tenant.burst) + 1000,
                ],
            )
        except REDIS_DOWN as exc:
            raise unavailable("quota store unavailable; retry later") from exc
        admitted, kind, retry_ms = reply
        if not int(admitted):
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            raise QuotaRefused(tenant.name, kind, int(retry_ms))
        return Held(tenant.name, request_id)

    async def release(self, held: Held) -> None:
        """Called when the call ends, whatever the outcome (shielded by the caller). Never
        raises: an entry that cannot be removed expires at its deadline anyway."""
        try:
            await self._redis.zrem(keys.quota_in_flight_key(held.tenant), held.request_id)
        except (RedisError, OSError) as exc:
            log.warning("quota release failed", tenant=held.tenant, error=type(exc).__name__)

    async def in_flight(self, tenant: str) -> int:
        """Entries in the tenant's in-flight set (expired ones included until the next
        acquire drops them); for tests and diagnostics."""
        return int(await self._redis.zcard(keys.quota_in_flight_key(tenant)))
