"""ModelStatistics across gateway replicas: each gateway's counts added to one Redis hash
per (model, version) (keys.stats_key), in one pipelined flush every `statistics_flush_ms`,
never a call per request; read back (plus what this gateway has not flushed) by
ModelStatistics and the REST statistics endpoint. See gateway/statistics.py for the fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis.asyncio as aioredis
import structlog

from tiermesh.core import keys
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.gateway.statistics import (
    DURATIONS,
    BatchStats,
    Duration,
    InferenceStatistics,
    Key,
    VersionStatistics,
)

log = structlog.get_logger("tiermesh.gateway.statistics")
# How long a batch is remembered as counted. The gateways that answered requests of one
# batch flush within about a flush interval (500 ms) of each other; only a flush held up
# longer than this (Redis away) could count a batch twice. Kept short: one key per batch,
# and under load they add up (10 minutes of them held megabytes in the soak test).
BATCH_SEEN_TTL_MS = 20_000

# KEYS: 1 the stats hash, 2.. one "batch counted" key per new batch.
# ARGV: 1 number of (field, increment) pairs, the pairs, last inference (unix ms), the TTL
#       of the batch keys (ms), then per batch: size, compute_infer ns, compute_output ns.
_FLUSH = """
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  redis.call('HINCRBY', KEYS[1], ARGV[2 + 2 * i], ARGV[3 + 2 * i])
end
local at = 2 + 2 * n
local last = tonumber(ARGV[at])
if last > tonumber(redis.call('HGET', KEYS[1], 'last_inference') or '0') then
  redis.call('HSET', KEYS[1], 'last_inference', ARGV[at])
end
for j = 2, #KEYS do
  local b = at + 2 + 3 * (j - 2)
  if redis.call('SET', KEYS[j], '1', 'NX', 'PX', ARGV[at + 1]) then
    local size = ARGV[b]
    redis.call('HINCRBY', KEYS[1], 'execution_count', 1)
    redis.call('HINCRBY', KEYS[1], 'b' .. size .. ':count', 1)
    redis.call('HINCRBY', KEYS[1], 'b' .. size .. ':compute_infer_ns', ARGV[b + 1])
    redis.call('HINCRBY', KEYS[1], 'b' .. size .. ':compute_output_ns', ARGV[b + 2])
  end
end
return 1
"""


class StatisticsStore:
    """Flushes an InferenceStatistics into Redis and reads the mesh's sums back."""

    def __init__(self, redis: aioredis.Redis, statistics: InferenceStatistics) -> None:
        self._redis = redis
        self._stats = statistics
        self.statistics = statistics
        self._script = redis.register_script(_FLUSH)
        self.lost_flushes = 0

    async def flush(self) -> None:
        """Everything counted since the last flush into Redis, in one round trip; kept for
        the next try when Redis fails."""
        drained = self._stats.drain()
        if not drained:
            self._stats.flushed(drained, ok=True)
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for (model, version), stats in drained.items():
                    keys_, args = _flush_args(model, version, stats)
                    await self._script(keys=keys_, args=args, client=pipe)
                await pipe.execute()
        except (aioredis.RedisError, OSError) as exc:
            self.lost_flushes += 1
            log.debug("statistics not flushed yet", error=repr(exc))
            self._stats.flushed(drained, ok=False)
            return
        self._stats.flushed(drained, ok=True)

    async def run(self, interval_s: float) -> None:
        """Flush every `interval_s` until cancelled (the owner flushes once more after)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()
            raise_if_cancelling()

    async def read(self, wanted: Sequence[Key]) -> dict[Key, VersionStatistics]:
        """The mesh's figures of each (model, version): Redis's sums plus what this gateway
        has not flushed yet. Raises Redis errors."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for model, version in wanted:
                pipe.hgetall(keys.stats_key(model, version))
            rows = await pipe.execute()
        out = {}
        for key, row in zip(wanted, rows, strict=True):
            stats = parse_hash(row)
            stats.merge(self._stats.of(*key))
            out[key] = stats
        return out


def _flush_args(
    model: str, version: str, stats: VersionStatistics
) -> tuple[list[str], list[str | int]]:
    pairs: list[str | int] = []
    for name in DURATIONS:
        d = stats.duration(name)
        if d.count:
            pairs += [f"{name}_count", d.count, f"{name}_ns", d.ns]
    if stats.inference_count:
        pairs += ["inference_count", stats.inference_count]
    batch_keys = [keys.stats_batch_key(model, b.worker, b.start_ns) for b in stats.new_batches]
    batch_args: list[str | int] = []
    for b in stats.new_batches:
        batch_args += [b.size, b.compute_infer_ns, b.compute_output_ns]
    args = [len(pairs) // 2, *pairs, stats.last_inference_ms, BATCH_SEEN_TTL_MS, *batch_args]
    return [keys.stats_key(model, version), *batch_keys], args


def parse_hash(row: dict[bytes, bytes] | dict[str, str]) -> VersionStatistics:
    """A stats hash as Redis holds it (see _FLUSH) back into figures."""
    fields = {_text(k): int(_text(v)) for k, v in row.items()}
    stats = VersionStatistics(
        inference_count=fields.get("inference_count", 0),
        execution_count=fields.get("execution_count", 0),
        last_inference_ms=fields.get("last_inference", 0),
    )
    for name in DURATIONS:
        d = stats.duration(name)
        d.count, d.ns = fields.get(f"{name}_count", 0), fields.get(f"{name}_ns", 0)
    for field, value in fields.items():
        size, sep, rest = field.partition(":")
        if not (sep and size.startswith("b") and size[1:].isdigit()):
            continue
        per_size = stats.batches.setdefault(int(size[1:]), BatchStats())
        if rest == "count":
            per_size.compute_infer.count = per_size.compute_output.count = value
        elif rest == "compute_infer_ns":
            per_size.compute_infer.ns = value
        elif rest == "compute_output_ns":
            per_size.compute_output.ns = value
    return stats


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["Duration", "StatisticsStore", "parse_hash"]
