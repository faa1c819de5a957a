"""Worker autoscaling counts the whole backlog of a tier (issue 26, acceptance 4): 38 work
streams holding 63 entries each, read by the router's real collector from a real Redis,
ask the HPA for the replicas that ~2,400 entries need. The former design (a KEDA
`redis-streams` trigger per stream, lagCount 64) asked for one: the HPA takes the highest
desired count over its metrics, and no single stream reached 64.

The HPA's rule, as Kubernetes documents it (horizontal-pod-autoscale, "Algorithm details")
and KEDA feeds it (each trigger one External metric; `AverageValue`: the metric's value
divided by the target per replica): desired = ceil(current * value / (current * target)),
kept at current within a 10% tolerance, the highest over all metrics, then clamped to
[minReplicaCount, maxReplicaCount]."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client import CollectorRegistry

from tiermesh.core import keys
from tiermesh.core.repository import ModelRepository
from tiermesh.router.metrics import QueueCollector

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STREAMS, ENTRIES = 38, 63
TOLERANCE = 0.1


def hpa_desired(current: int, metrics: Sequence[tuple[float, float]], lo: int, hi: int) -> int:
    """Replicas the HPA asks for, from (value, target per replica) of AverageValue metrics."""
    proposals = []
    for value, target in metrics:
        ratio = (value / current) / target
        proposals.append(current if abs(ratio - 1) <= TOLERANCE else math.ceil(ratio * current))
    return min(max(max(proposals), lo), hi)


@pytest.fixture
def client(redis_server: str) -> Iterator[redis.Redis]:
    r = redis.Redis.from_url(redis_server)
    r.flushdb()
    yield r
    r.flushdb()
    r.close()


def test_a_backlog_spread_over_many_streams_asks_for_the_replicas_it_needs(
    client: redis.Redis, redis_server: str
) -> None:
    configs = ModelRepository(ROOT / "models").load()
    collector = QueueCollector(redis_server, configs)
    try:
        center = [k for k in collector._streams if k.tier == "center"]
        assert len(center) >= STREAMS
        filled = center[:STREAMS]
        for key in filled:  # the group first, as workers create it: every entry is lag
            client.xgroup_create(key.name, keys.GROUP, id="$", mkstream=True)
            with client.pipeline(transaction=False) as pipe:
                for i in range(ENTRIES):
                    pipe.xadd(key.name, {keys.JOB_FIELD: f"job-{i}"})
                pipe.execute()
        # Two of them read by a worker and not yet acknowledged: in flight, still counted.
        client.xreadgroup(keys.GROUP, "w1", {filled[0].name: ">"}, count=5)
        registry = CollectorRegistry()
        registry.register(collector)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in registry.collect()
            for s in family.samples
        }
    finally:
        collector.close()
    backlog = samples[("tiermesh_tier_backlog", (("tier", "center"),))]
    assert backlog == STREAMS * ENTRIES == 2394
    assert samples[("tiermesh_tier_backlog", (("tier", "edge"),))] == 0
    lags = [
        v
        for (name, labels), v in samples.items()
        if name == "tiermesh_consumer_lag" and ("tier", "center") in labels and v
    ]
    assert len(lags) == STREAMS and max(lags) == ENTRIES

    spec = yaml.safe_load((ROOT / "deploy/k8s/base/worker-center/scaledobject.yaml").read_text())[
        "spec"
    ]
    (trigger,) = spec["triggers"]
    target = float(trigger["metadata"]["threshold"])
    lo, hi = spec["minReplicaCount"], spec["maxReplicaCount"]
    needed = math.ceil(backlog / target)
    assert needed == 38
    # From one replica: the summed backlog asks for all it needs, up to the maximum.
    assert hpa_desired(1, [(backlog, target)], lo, hi) == min(needed, hi) == hi
    assert hpa_desired(1, [(backlog, target)], lo, 100) == needed
    # The former design: one metric per stream, each under its target: one replica.
    assert hpa_desired(1, [(lag, 64.0) for lag in lags], lo, hi) == 1
    # Drained to a few entries: back to the minimum (after the scale-down window).
    assert hpa_desired(hi, [(10.0, target)], lo, hi) == lo
