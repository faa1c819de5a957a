"""Postprocess metrics: output-step time per model and delivery outcomes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from tiermesh.core.delivery_client import deliveries_counter
from tiermesh.core.metrics import LATENCY_BUCKETS


class PostprocessMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.step = Histogram(
            "tiermesh_postprocess_step_seconds",
            "Output step time per result (a batch's step time shared by its results)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.deliveries = deliveries_counter(registry)
