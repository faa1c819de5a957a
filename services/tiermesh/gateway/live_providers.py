"""The execution providers the live workers' sessions of a model actually got, for
ModelConfig (`execution_providers_live`). Workers publish theirs with every heartbeat
(worker/streams.py: a key per worker, compute unit and tier, expiring with the membership);
a worker counts only while it is a live member of the worker set (its key may outlive it by
less than a heartbeat's TTL). What each tier's config asks for is `execution_providers`
(converters.py); this is what the workers got (a worker's own setting wins, CPU may be a
fallback)."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.redis_cluster import get_many
from tiermesh.core.repository import ModelConfig

log = structlog.get_logger("tiermesh.gateway")

# The ModelConfig parameter: JSON, tier -> provider -> live workers.
EXECUTION_PROVIDERS_LIVE = "execution_providers_live"

LiveCounts = dict[str, dict[str, int]]


@dataclass(frozen=True, slots=True)
class UnitOnTier:
    """What one (compute unit, tier) holds: its live workers, and the provider each worker
    that published one got."""

    tier: str
    live: frozenset[str]
    providers: Mapping[str, str]


def served_units(cfg: ModelConfig, version: str = "") -> list[tuple[ComputeUnit, str]]:
    """(compute unit, tier) of every tier the model is served on (its tiers, else the default
    tier), with the variant that tier serves a caller naming none, in `version` ("" = the
    default one; an unknown one has none)."""
    ver = cfg.version(version)
    if ver is None:
        return []
    return [(cfg.unit(ver.version, variant), tier) for tier, variant in cfg.tier_variants.items()]


def count_live(units: Iterable[UnitOnTier]) -> LiveCounts:
    """tier -> provider -> how many live workers got it: a worker counts once per provider
    on a tier, whichever units it serves there; fields of workers no longer live (or never
    live) are left out. Every tier given is in the answer, one without any as {}."""
    workers: dict[str, dict[str, set[str]]] = {}
    for u in units:
        by_provider = workers.setdefault(u.tier, defaultdict(set))
        for worker, provider in u.providers.items():
            if worker in u.live and provider:
                by_provider[provider].add(worker)
    return {
        tier: {provider: len(ids) for provider, ids in sorted(by_provider.items())}
        for tier, by_provider in workers.items()
    }


def parameter_value(counts: LiveCounts) -> str:
    return json.dumps(counts, separators=(",", ":"), sort_keys=True)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class LiveProviders:
    """Reads the live providers of a model from Redis; built once by the gateway's __main__."""

    def __init__(
        self, redis: aioredis.Redis, clock_ms: Callable[[], float] = lambda: time.time() * 1000
    ) -> None:
        self._redis = redis
        # Wall clock: heartbeats score members by wall-clock expiry (worker/streams.py).
        self._clock_ms = clock_ms

    async def read(self, cfg: ModelConfig, version: str = "") -> LiveCounts | None:
        """The counts of `cfg` in `version` ("" = the default one), read in two round trips
        (the live members, then their providers); None when Redis could not be read
        (logged: ModelConfig answers without them)."""
        units = served_units(cfg, version)
        now_ms = int(self._clock_ms())
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for unit, tier in units:
                    pipe.zrangebyscore(keys.workers_key(unit, tier), now_ms, "+inf")
                members = [[_text(m) for m in live] for live in await pipe.execute()]
            wanted = [
                keys.provider_key(unit, tier, worker)
                for (unit, tier), live in zip(units, members, strict=True)
                for worker in live
            ]
            got = iter(await get_many(self._redis, wanted))
        except (aioredis.RedisError, OSError) as exc:
            log.warning("live execution providers unreadable", model=cfg.name, error=str(exc))
            return None
        on_tiers = []
        for (_, tier), live in zip(units, members, strict=True):
            providers = {worker: _text(p) for worker in live if (p := next(got)) is not None}
            on_tiers.append(UnitOnTier(tier, frozenset(live), providers))
        return count_live(on_tiers)
