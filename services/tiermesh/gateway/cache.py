"""The gateway's response cache: answers of identical requests, kept in Redis for a while.

An answer is found by a digest of everything that decides it (model, version, variant,
tenant unless the model shares answers across tenants, requested outputs, inputs). Per
model, each answer is a string that expires by itself (PX = the model's TTL), and an index
(sorted set of digests scored by insertion time) lets a write drop the oldest answers so the
cache never holds more than the model's `max_entries`.

The cache is an optimisation: Redis trouble never fails a request. A read that fails is a
miss and a write that fails is skipped, each logged as a warning without payloads.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Sequence

import grpc
import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from tiermesh.core import keys
from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import CacheSpec
from tiermesh.core.tensors import TensorData
from tiermesh.core.wire import result_from_proto, result_to_proto
from tiermesh.v1 import job_pb2

log = structlog.get_logger("tiermesh.gateway")

# Bumped whenever the encoding below changes, so old entries can never be mistaken for new.
_DIGEST_DOMAIN = b"tiermesh.response-cache.v1"
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")

# KEYS[1] entry key, KEYS[2] index key.
# ARGV[1] value, ARGV[2] ttl (ms), ARGV[3] max entries, ARGV[4] digest, ARGV[5] entry prefix.
# Scores are milliseconds with a microsecond fraction, so writes within one millisecond keep
# their order. They are built as strings: Lua prints numbers with 14 significant digits.
# Index members older than the TTL are deleted as well as dropped, so an answer written with
# a longer TTL (before a config change) cannot outlive its place in the index.
_PUT_SCRIPT = """
local t = redis.call('TIME')
local sec = tonumber(t[1])
local usec = tonumber(t[2])
local now_ms = sec * 1000 + math.floor(usec / 1000)
local frac = usec % 1000
local ttl_ms = tonumber(ARGV[2])
local max_entries = tonumber(ARGV[3])
local prefix = ARGV[5]
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl_ms)
redis.call('ZADD', KEYS[2], string.format('%d.%03d', now_ms, frac), ARGV[4])
local cutoff = string.format('(%d.%03d', now_ms - ttl_ms, frac)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff)
for i = 1, #expired do
  redis.call('DEL', prefix .. expired[i])
end
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
end
local excess = redis.call('ZCARD', KEYS[2]) - max_entries
if excess > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #popped, 2 do
    redis.call('DEL', prefix .. popped[i])
  end
end
-- The index goes once every answer in it has expired; never sooner (a shorter TTL after a
-- config change must not orphan answers written with a longer one).
if redis.call('PTTL', KEYS[2]) < ttl_ms then
  redis.call('PEXPIRE', KEYS[2], ttl_ms)
end
"""


def cache_digest(
    model: str,
    version: str,
    variant: str,
    tenant: str | None,
    inputs: Sequence[TensorData],
    requested_outputs: Sequence[str],
) -> str:
    """The sha256 hex digest naming one answer.

    Every variable-length field is length-prefixed and every list count-prefixed, so no two
    different requests encode alike. Inputs count by name, not by position. Requested outputs
    count in their order (an answer may list its outputs in that order). `tenant` None means
    an answer shared by all tenants, distinct from any tenant, the empty one included.
    """
    h = hashlib.sha256()

    def field(data: bytes) -> None:
        h.update(_U64.pack(len(data)))
        h.update(data)

    field(_DIGEST_DOMAIN)
    field(model.encode())
    field(version.encode())
    field(variant.encode())
    if tenant is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01")
        field(tenant.encode())
    h.update(_U64.pack(len(requested_outputs)))
    for name in requested_outputs:
        field(name.encode())
    # Ties on name only happen in requests validation refuses; the full key keeps even
    # those deterministic.
    ordered = sorted(inputs, key=lambda t: (t.name, t.datatype, t.shape, t.raw))
    h.update(_U64.pack(len(ordered)))
    for tensor in ordered:
        field(tensor.name.encode())
        field(tensor.datatype.encode())
        h.update(_U64.pack(len(tensor.shape)))
        for dim in tensor.shape:
            h.update(_I64.pack(dim))
        field(tensor.raw)
    return h.hexdigest()


def _encode(result: JobResult) -> bytes:
    """What an answer needs and nothing about the request that produced it."""
    answer = JobResult(
        request_id="",
        model=result.model,
        gateway="",
        outputs=result.outputs,
        version=result.version,
        variant=result.variant,
        annotations=result.annotations,
    )
    msg = result_to_proto(answer)
    msg.ClearField("timing")
    return bytes(msg.SerializeToString(deterministic=True))


class AnswerCache:
    """Reads and writes cached answers; one per gateway process, sharing its Redis client.

    `hits` and `misses` count reads (a failed read is a miss); `errors` counts reads and
    writes that Redis or a corrupt entry failed.
    """

    def __init__(self, redis: aioredis.Redis) -> None:
        self._redis = redis
        self._put = redis.register_script(_PUT_SCRIPT)
        self.hits = 0
        self.misses = 0
        self.errors = 0

    async def get(self, model: str, digest: str) -> JobResult | None:
        """Called before a request is routed. Returns the cached answer (outputs, annotations,
        model, version, variant; no request identity, timing or trace context), or None on a
        miss, on Redis trouble and on an entry that does not decode. Never raises for those."""
        try:
            data = await self._redis.get(keys.cache_entry_key(model, digest))
        except (RedisError, OSError) as exc:
            self.misses += 1
            self.errors += 1
            log.warning("response cache read failed", model=model, error=type(exc).__name__)
            return None
        if data is None:
            self.misses += 1
            return None
        # Mostly protobuf's DecodeError (its package ships no type stubs): an entry that
        # cannot be read is a miss, whatever the runtime raises.
        try:
            cached = result_from_proto(job_pb2.Result.FromString(data))
        except Exception:
            cached = None
        if cached is None or cached.code != grpc.StatusCode.OK:
            self.misses += 1
            self.errors += 1
            log.warning("response cache entry unusable", model=model)
            return None
        self.hits += 1
        return cached

    async def put(self, model: str, digest: str, result: JobResult, spec: CacheSpec) -> None:
        """Called with a request's answer. Stores it for `spec.ttl_s` when it succeeded and
        the model's cache is on, then drops expired and oldest entries past
        `spec.max_entries`, all in one atomic script. A failed answer is never stored, and
        Redis trouble skips the write without raising."""
        if result.code != grpc.StatusCode.OK or not spec.enabled:
            return
        if not math.isfinite(spec.ttl_s) or spec.ttl_s <= 0 or spec.max_entries < 1:
            return
        ttl_ms = max(1, round(spec.ttl_s * 1000))
        try:
            await self._put(
                keys=[keys.cache_entry_key(model, digest), keys.cache_index_key(model)],
                args=[
                    _encode(result),
                    ttl_ms,
                    spec.max_entries,
                    digest,
                    keys.cache_entry_prefix(model),
                ],
            )
        except (RedisError, OSError) as exc:
            self.errors += 1
            log.warning("response cache write failed", model=model, error=type(exc).__name__)
