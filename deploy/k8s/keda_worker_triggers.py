"""Write the KEDA ScaledObjects of the worker Deployments from the model repository.

KEDA's `redis-streams` scaler reads one stream per trigger, and a tier's workers read every
work stream of the models they serve (tiermesh.core.keys: one per version and variant,
priority level and length bucket). So each tier's ScaledObject has one trigger per such
stream, scaling on the consumer group's lag. Run after adding a model, a version, a
variant, a bucket or a priority level (tests/unit/test_deploy_k8s.py fails until then):

    .venv/bin/python deploy/k8s/keda_worker_triggers.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

from tiermesh.core import keys
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository
from tiermesh.router.metrics import QueueCollector

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
TIERS = ("center", "edge")
# The collector is only asked for its stream list; it never connects.
UNUSED_REDIS = "redis://127.0.0.1:1/0"

# Entries waiting per worker replica before KEDA adds one (the HPA's AverageValue target).
LAG_PER_REPLICA = {"center": 64, "edge": 32}
# Replicas stay between these; never 0: the router refuses a model with no live worker of
# a tier, and the consumer groups are created by the workers themselves.
MIN_REPLICAS = {"center": 1, "edge": 1}
MAX_REPLICAS = {"center": 20, "edge": 10}
# Cold-start protection: a new worker loads its models before it reads (tens of seconds),
# so shrink slowly and only after the queues stayed short for a while.
COOLDOWN_S = 300
SCALE_DOWN_WINDOW_S = 300
# KEDA's TriggerAuthentication holding Redis's password (base/mesh/redis-auth.yaml).
REDIS_AUTH = "tiermesh-redis"


def served_by(cfg: ModelConfig, tier: str) -> bool:
    if cfg.companion_of:
        return False  # shares its parent's streams
    if not cfg.tiers:
        return tier == "center"  # config.py: no tiers means center only
    return any(t.name == tier for t in cfg.tiers)


def streams(configs: dict[str, ModelConfig], tier: str) -> list[str]:
    """Every work stream a worker of `tier` reads: the router's own list of work streams
    (the ones it exports `tiermesh_consumer_lag` for: every version and variant of every
    model), kept to the tier's streams of the models that tier serves."""
    served = {cfg.name for cfg in configs.values() if served_by(cfg, tier)}
    collector = QueueCollector(UNUSED_REDIS, configs)
    try:
        listed: list[keys.StreamKey] = collector._streams
    finally:
        collector.close()
    # A stream's unit starts with its model's name, which holds neither '@' nor '.'.
    return sorted(
        k.name for k in listed if k.tier == tier and re.split(r"[@.]", k.model)[0] in served
    )


def scaled_object(tier: str, stream_names: list[str]) -> dict[str, Any]:
    deployment = f"worker-{tier}"
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": deployment},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment},
            "pollingInterval": 5,
            "cooldownPeriod": COOLDOWN_S,
            "minReplicaCount": MIN_REPLICAS[tier],
            "maxReplicaCount": MAX_REPLICAS[tier],
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        },
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [
                                {"type": "Percent", "value": 100, "periodSeconds": 15},
                                {"type": "Pods", "value": 4, "periodSeconds": 15},
                            ],
                            "selectPolicy": "Max",
                        },
                    }
                }
            },
            "triggers": [
                {
                    "type": "redis-streams",
                    "metadata": {
                        # host:port of Redis, read from the worker container's environment
                        # (ConfigMap tiermesh-redis), so an external Redis changes one place.
                        "addressFromEnv": "TIERMESH_REDIS_ADDRESS",
                        "stream": name,
                        "consumerGroup": keys.GROUP,
                        "lagCount": str(LAG_PER_REPLICA[tier]),
                        # Active (and so scaled up from idle) from a single waiting entry.
                        "activationLagCount": "0",
                    },
                    # Redis's password (the Secret tiermesh-redis-auth), by way of KEDA's
                    # TriggerAuthentication tiermesh-redis (base/mesh/redis-auth.yaml).
                    "authenticationRef": {"name": REDIS_AUTH},
                }
                for name in stream_names
            ],
        },
    }


def render(repository: Path = ROOT / "models") -> dict[str, str]:
    """Path (relative to deploy/k8s) -> YAML text, for every tier."""
    configs = ModelRepository(repository).load()
    out = {}
    for tier in TIERS:
        doc = scaled_object(tier, streams(configs, tier))
        text = yaml.safe_dump(doc, sort_keys=False, width=100)
        out[f"base/worker-{tier}/scaledobject.yaml"] = (
            "# Generated by deploy/k8s/keda_worker_triggers.py from models/: do not edit.\n" + text
        )
    return out


def main() -> int:
    for rel, text in render().items():
        (HERE / rel).write_text(text)
        print(f"wrote deploy/k8s/{rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
