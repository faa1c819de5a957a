"""The router's metrics: admissions by outcome, and - read from Redis at scrape time - the
depth, consumer-group lag and pending count of every work stream, and each tier's backlog
(what the workers' autoscaling reads: deploy/k8s/base/worker-*/scaledobject.yaml)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import redis
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tiermesh.core import keys
from tiermesh.core.metrics import STREAM_LABELS, stream_labels
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.redis_client import connect_sync

TIERS = ("edge", "center")


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.admissions = Counter(
            "tiermesh_admissions",
            "Jobs routed (on the gateways' RouteStream), by model and admission outcome",
            ["model", "outcome"],
            registry=registry,
        )


class QueueCollector(Collector):
    """Scrape-time gauges of the work streams, with a synchronous Redis client of its own
    (scrapes run on the metrics server's thread, not on the event loop)."""

    def __init__(self, redis_url: str, configs: Mapping[str, ModelConfig]) -> None:
        self._redis = connect_sync(redis_url, socket_timeout=2)
        self._streams = [
            k
            for cfg in configs.values()
            if not cfg.companion_of
            for version in cfg.versions
            for variant in cfg.variants
            for tier in TIERS
            for k in keys.stream_keys(
                cfg.unit(version.version, variant),
                tier,
                cfg.priority_levels,
                cfg.bucket_count,
            )
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "tiermesh_queue_depth",
            "Entries in the work stream (waiting or in flight)",
            labels=STREAM_LABELS,
        )
        lag = GaugeMetricFamily(
            "tiermesh_consumer_lag", "Entries no worker has read yet", labels=STREAM_LABELS
        )
        pending = GaugeMetricFamily(
            "tiermesh_consumer_pending",
            "Entries read but not yet acknowledged",
            labels=STREAM_LABELS,
        )
        backlog = GaugeMetricFamily(
            "tiermesh_tier_backlog",
            "Entries of a tier's work streams not yet acknowledged: waiting for a worker "
            "or read and being computed (every model, version, priority and bucket)",
            labels=["tier"],
        )
        read = self._read()
        for key, length, group in read:
            labels = list(stream_labels(key).values())
            depth.add_metric(labels, length)
            if group is not None:
                lag.add_metric(labels, max(group.get("lag", 0), 0))
                pending.add_metric(labels, group.get("pending", 0))
        if read:  # nothing when Redis could not be read: no figure rather than a false 0
            for tier, entries in tier_backlog(read).items():
                backlog.add_metric([tier], entries)
        yield from (depth, lag, pending, backlog)

    def _read(self) -> list[tuple[keys.StreamKey, int, dict[str, int] | None]]:
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for key in self._streams:
                    pipe.xlen(key.name)
                lengths = pipe.execute()
            out: list[tuple[keys.StreamKey, int, dict[str, int] | None]] = []
            for key, length in zip(self._streams, lengths, strict=True):
                if not length:  # an empty stream has nothing waiting or in flight
                    out.append((key, 0, {"lag": 0, "pending": 0}))
                    continue
                groups = self._redis.xinfo_groups(key.name)
                group = next(
                    (
                        {"lag": _count(g.get("lag")), "pending": _count(g.get("pending"))}
                        for g in groups
                        if g.get("name") in (keys.GROUP, keys.GROUP.encode())
                    ),
                    None,
                )
                out.append((key, int(length), group))
            return out
        except (redis.RedisError, OSError):
            return []

    def close(self) -> None:
        self._redis.close()


def tier_backlog(
    streams: Iterable[tuple[keys.StreamKey, int, dict[str, int] | None]],
) -> dict[str, int]:
    """Per tier, the entries no worker has acknowledged: each stream's lag plus pending
    (its whole length where its consumer group does not exist yet: nobody read any)."""
    out = dict.fromkeys(TIERS, 0)
    for key, length, group in streams:
        if group is None or group.get("lag", -1) < 0:
            waiting = length  # acknowledged entries are deleted: what is left is the backlog
        else:
            waiting = group["lag"] + group.get("pending", 0)
        out[key.tier] = out.get(key.tier, 0) + waiting
    return out


def _count(value: object) -> int:
    """A count of XINFO GROUPS; -1 for a lag Redis cannot tell (entries deleted past the
    group's last read)."""
    return -1 if value is None else int(value)  # type: ignore[call-overload]
