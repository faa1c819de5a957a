"""Scrape-time gauges the alerting rules need beyond QueueCollector's depth and lag: the age
of the oldest entry of every work stream, dead-letter stream lengths, live workers per
compute unit and tier (by heartbeat), and Redis memory (deploy/prometheus/alerts.yml).

Read with a synchronous Redis client of its own, on the metrics server's thread, in two
pipelined round trips per scrape whatever the number of streams.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.metrics import STREAM_LABELS, stream_labels
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.redis_client import connect_sync

TIERS = ("edge", "center")
UNIT_LABELS = ("model", "version", "variant", "tier")


@dataclass
class HealthReading:
    """One scrape's raw figures; empty when Redis did not answer."""

    oldest_ms: dict[keys.StreamKey, int] = field(default_factory=dict)  # entry-id ms, non-empty
    dead_letters: dict[tuple[ComputeUnit, str], int] = field(default_factory=dict)  # (unit, tier)
    live_workers: dict[tuple[ComputeUnit, str], int] = field(default_factory=dict)
    memory: dict[str, int] = field(default_factory=dict)


def entry_ms(entry_id: bytes | str) -> int:
    """The milliseconds part of a stream entry id (`1712345678901-0`): its XADD time."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.split("-", 1)[0])


def unit_labels(unit: ComputeUnit, tier: str) -> list[str]:
    return [*unit.labels, tier]


def families(reading: HealthReading, now_ms: int) -> list[GaugeMetricFamily]:
    """The gauges of one reading (pure: no Redis)."""
    age = GaugeMetricFamily(
        "tiermesh_queue_oldest_age_seconds",
        "Age of the oldest entry in the work stream (waiting or in flight); 0 when empty",
        labels=STREAM_LABELS,
    )
    for key, ms in reading.oldest_ms.items():
        age.add_metric(list(stream_labels(key).values()), max(0.0, (now_ms - ms) / 1000))
    dead = GaugeMetricFamily(
        "tiermesh_dead_letters",
        "Entries in the dead-letter stream of a compute unit and tier (kept for inspection)",
        labels=UNIT_LABELS,
    )
    for (unit, tier), n in reading.dead_letters.items():
        dead.add_metric(unit_labels(unit, tier), n)
    live = GaugeMetricFamily(
        "tiermesh_workers_live",
        "Workers of a compute unit and tier whose heartbeat has not expired",
        labels=UNIT_LABELS,
    )
    for (unit, tier), n in reading.live_workers.items():
        live.add_metric(unit_labels(unit, tier), n)
    out = [age, dead, live]
    if reading.memory:
        used = GaugeMetricFamily("tiermesh_redis_memory_used_bytes", "Redis used_memory")
        used.add_metric([], reading.memory.get("used_memory", 0))
        cap = GaugeMetricFamily(
            "tiermesh_redis_maxmemory_bytes", "Redis maxmemory (0: no limit configured)"
        )
        cap.add_metric([], reading.memory.get("maxmemory", 0))
        out += [used, cap]
    return out


class HealthCollector(Collector):
    def __init__(
        self,
        redis_url: str,
        configs: Mapping[str, ModelConfig],
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._redis = connect_sync(redis_url, socket_timeout=2)
        self._clock_ms = clock_ms
        self._units = sorted(
            {
                (cfg.unit(version.version, variant), tier)
                for cfg in configs.values()
                if not cfg.companion_of
                for version in cfg.versions
                for variant in cfg.variants
                for tier in TIERS
            }
        )
        by_unit = {(c.name, c.priority_levels, c.bucket_count) for c in configs.values()}
        self._streams = [
            k
            for name, levels, buckets in sorted(by_unit)
            for unit, tier in self._units
            if unit.model == name
            for k in keys.stream_keys(unit, tier, levels, buckets)
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now_ms = self._clock_ms()
        yield from families(self.read(now_ms), now_ms)

    def read(self, now_ms: int) -> HealthReading:
        reading = HealthReading()
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for key in self._streams:
                    pipe.xrange(key.name, count=1)
                for unit, tier in self._units:
                    pipe.xlen(keys.dead_letter_key(unit, tier))
                    pipe.zcount(keys.workers_key(unit, tier), now_ms, "+inf")
                replies = pipe.execute()
            info = self._redis.info("memory")
        except (redis.RedisError, OSError):
            return reading
        firsts, rest = replies[: len(self._streams)], replies[len(self._streams) :]
        for key, first in zip(self._streams, firsts, strict=True):
            if first:
                reading.oldest_ms[key] = entry_ms(first[0][0])
            else:
                reading.oldest_ms[key] = now_ms
        for i, unit_tier in enumerate(self._units):
            reading.dead_letters[unit_tier] = int(rest[2 * i])
            reading.live_workers[unit_tier] = int(rest[2 * i + 1])
        reading.memory = {k: int(info.get(k) or 0) for k in ("used_memory", "maxmemory")}
        return reading

    def close(self) -> None:
        self._redis.close()
