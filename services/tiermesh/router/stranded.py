"""Work stranded on a tier whose workers all died: moved to a live tier.

A tier's streams are read only by that tier's workers. When every one of them dies at once
(an edge node lost, SIGKILL: no graceful leave), the router stops choosing the tier once
their heartbeats expire, but what it queued there before, and what the dead workers had
read and not acknowledged, would wait for a worker that never comes. Every router looks,
every `interval`, at each tiered model's streams: a tier with no live worker whose streams
hold entries has them moved to a live tier (the last tier first: it takes any cost), each
job re-aimed at that tier's variant, keeping its priority, bucket and trace context. One
script per stream moves its entries atomically and only while the source tier is still
dead and the target alive, each entry deleted from the source in the same step it is added
to the target, so two routers never move one entry twice; on a Redis Cluster the script
returns once a replica has the move. A worker that was only late with its heartbeat may
still answer an entry moved meanwhile: the caller's gateway keeps the first answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry, Counter

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.loops import repeat
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.redis_cluster import run_script
from tiermesh.core.tier_spec import TierSpec
from tiermesh.core.wire import decode_job, encode_job

log = structlog.get_logger("tiermesh.router")

# Entries moved per stream and round: a dead tier's backlog is bounded by admission, so a
# few rounds empty it.
MOVE_CHUNK = 256

# KEYS: 1 source stream, 2 target stream, 3 source workers, 4 target workers.
# ARGV: 1 group, 2-4 the entry's field names (job, traceparent, tracestate), then per entry:
# id, job, traceparent, tracestate.
# Moves nothing (returns -1) unless the source tier has no live worker and the target has.
_MOVE = """
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZCOUNT', KEYS[3], now_ms, '+inf') > 0 then return -1 end
if redis.call('ZCOUNT', KEYS[4], now_ms, '+inf') == 0 then return -1 end
local moved = 0
for i = 5, #ARGV, 4 do
  if redis.call('XDEL', KEYS[1], ARGV[i]) == 1 then
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
    redis.call('XADD', KEYS[2], '*', ARGV[2], ARGV[i + 1], ARGV[3], ARGV[i + 2],
               ARGV[4], ARGV[i + 3])
    moved = moved + 1
  end
end
return moved
"""


def rescue_tier(tiers: Sequence[TierSpec], dead: str, alive: set[str]) -> TierSpec | None:
    """Where the work of tier `dead` goes: the last live tier other than it (the last tier
    takes any cost; a lighter one only when nothing heavier lives), or None."""
    return next((t for t in reversed(tiers) if t.name != dead and t.name in alive), None)


@dataclass(frozen=True, slots=True)
class _Tier:
    """One tier of one version of a tiered model: its compute unit and streams."""

    cfg: ModelConfig
    spec: TierSpec
    unit: ComputeUnit
    streams: tuple[StreamKey, ...]


def _tiers_of(cfg: ModelConfig) -> list[list[_Tier]]:
    """Per version of a tiered model, each tier's unit and streams (online levels and the
    background one)."""
    out = []
    for version in cfg.versions:
        tiers = []
        for spec in cfg.tiers:
            unit = cfg.unit(version.version, cfg.variant_for("", spec))
            streams = (
                *keys.stream_keys(unit, spec.name, cfg.priority_levels, cfg.bucket_count),
                *keys.background_streams(unit, spec.name, cfg.bucket_count),
            )
            tiers.append(_Tier(cfg, spec, unit, streams))
        out.append(tiers)
    return out


class StrandedWork:
    """The router's mover of stranded work (see the module's docstring)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        configs: Mapping[str, ModelConfig],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._redis = redis
        self._configs = configs
        self._move = redis.register_script(_MOVE)
        self.moved = Counter(
            "tiermesh_stranded_entries_moved",
            "Entries moved from a tier with no live worker to a live one, by model and tiers",
            ["model", "from_tier", "to_tier"],
            registry=registry,
        )

    async def run(self, interval_s: float) -> None:
        """Rounds until cancelled; Redis trouble is logged and the next round retries."""
        await repeat(
            self.round,
            lambda: interval_s,
            lambda exc: log.warning("stranded work round failed", error=str(exc)),
        )

    async def round(self) -> int:
        """One look at every tiered model (each version's tiers at once, all of them in
        parallel: on a Redis Cluster, a model whose node is away does not hold back the
        others); how many entries were moved. Raises when no model could be looked at."""
        groups = [
            tiers
            for cfg in self._configs.values()
            if len(cfg.tiers) > 1 and not cfg.companion_of
            for tiers in _tiers_of(cfg)
        ]
        done = await asyncio.gather(
            *(self._look(tiers) for tiers in groups), return_exceptions=True
        )
        failed = [r for r in done if isinstance(r, BaseException)]
        if failed and len(failed) == len(done):
            raise failed[0]
        if failed:
            log.warning("stranded work unreadable for some models", error=str(failed[0]))
        return sum(r for r in done if isinstance(r, int))

    async def _look(self, tiers: list[_Tier]) -> int:
        """The tiers of one version of one model: a dead tier's work moved to a live one."""
        now_ms = int(time.time() * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for tier in tiers:
                pipe.zcount(keys.workers_key(tier.unit, tier.spec.name), now_ms, "+inf")
            live = await pipe.execute()
        alive = {t.spec.name for t, n in zip(tiers, live, strict=True) if int(n) > 0}
        moved = 0
        for tier in tiers:
            if tier.spec.name in alive:
                continue
            spec = rescue_tier([t.spec for t in tiers], tier.spec.name, alive)
            if spec is not None:
                moved += await self._move_tier(tier, next(t for t in tiers if t.spec is spec))
        return moved

    async def _move_tier(self, source: _Tier, target: _Tier) -> int:
        """Move what the streams of `source` hold to the same streams of `target`."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream in source.streams:
                pipe.xrange(stream.name, "-", "+", count=MOVE_CHUNK)
            contents = await pipe.execute()
        moved = 0
        for stream, entries in zip(source.streams, contents, strict=True):
            if entries:
                moved += await self._move_entries(source, target, stream, entries)
        return moved

    async def _move_entries(
        self,
        source: _Tier,
        target: _Tier,
        stream: StreamKey,
        entries: list[tuple[bytes, dict[bytes, bytes]]],
    ) -> int:
        to = StreamKey(target.unit, target.spec.name, stream.priority, stream.bucket)
        variant = target.unit.variant
        fields_named = [keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD]
        args: list[bytes | str] = [keys.GROUP, *fields_named]
        for entry_id, fields in entries:
            raw = fields.get(keys.JOB_FIELD.encode())
            if raw is None:
                continue
            try:
                job = decode_job(raw).with_(tier=target.spec.name, variant=variant)
            except Exception:  # not a job this router can read: left for the dead letters
                continue
            args += [
                entry_id,
                encode_job(job),
                fields.get(keys.TRACEPARENT_FIELD.encode(), b""),
                fields.get(keys.TRACESTATE_FIELD.encode(), b""),
            ]
        if len(args) == 1 + len(fields_named):
            return 0
        script_keys = [
            stream.name,
            to.name,
            keys.workers_key(source.unit, source.spec.name),
            keys.workers_key(target.unit, target.spec.name),
        ]
        moved = int(cast(int, await run_script(self._redis, self._move, script_keys, args)))
        if moved > 0:
            self.moved.labels(source.cfg.name, source.spec.name, target.spec.name).inc(moved)
            log.warning(
                "moved work stranded on a tier without live workers",
                model=source.cfg.name,
                stream=stream.name,
                to=to.name,
                n=moved,
            )
        return moved
