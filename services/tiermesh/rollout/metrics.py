"""Rollout metrics of the router: automatic rollbacks, and the canary share in force."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rollbacks = Counter(
            "tiermesh_rollout_rollbacks",
            "Canaries rolled back automatically, by model and breached check",
            ["model", "reason"],
            registry=registry,
        )
        self.canary_percent = Gauge(
            "tiermesh_rollout_canary_percent",
            "Share of a model's unpinned requests routed to its canary version (0: none)",
            ["model"],
            registry=registry,
        )
