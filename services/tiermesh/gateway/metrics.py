"""The gateway's metrics: requests by status code, latencies by model/tier/priority/bucket/
variant from each answer's own timeline, in-flight requests, response-cache lookups, auth
and quota refusals, lost audit entries."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiermesh.core.jobs import JobResult
from tiermesh.core.metrics import LATENCY_BUCKETS, REQUEST_LABELS


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "tiermesh_requests",
            "ModelInfer calls answered, by model and status code",
            ["model", "code"],
            registry=registry,
        )
        self.in_flight = Gauge(
            "tiermesh_requests_in_flight",
            "Requests this gateway is waiting on",
            registry=registry,
        )
        self.total = Histogram(
            "tiermesh_request_duration_seconds",
            "Received to answered, per request",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.queue = Histogram(
            "tiermesh_queue_duration_seconds",
            "Time in the work stream, per request",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "tiermesh_compute_duration_seconds",
            "Compute time of the request's batch",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.stages = Histogram(
            "tiermesh_stage_duration_seconds",
            "Every stage of the per-request timeline",
            [*REQUEST_LABELS, "stage"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.cache = Counter(
            "tiermesh_cache_lookups",
            "Response-cache lookups, by model and result",
            ["model", "result"],
            registry=registry,
        )
        # Tenants come from the tenants file, so the `tenant` label stays bounded.
        self.auth_refusals = Counter(
            "tiermesh_auth_refusals",
            "Calls refused UNAUTHENTICATED or PERMISSION_DENIED, by reason",
            ["reason"],
            registry=registry,
        )
        self.quota_refusals = Counter(
            "tiermesh_quota_refusals",
            "Requests refused over a tenant's rate limit or in-flight cap",
            ["tenant", "kind"],
            registry=registry,
        )
        self.audit_lost = Counter(
            "tiermesh_audit_entries_lost",
            "Audit entries that could not be written (Redis trouble or a full queue)",
            registry=registry,
        )

    def answered(self, model: str, code: grpc.StatusCode) -> None:
        self.requests.labels(model=model, code=code.name).inc()

    def timeline(self, result: JobResult, priority: int, breakdown_ms: dict[str, float]) -> None:
        """Called once per computed answer with its breakdown (milliseconds)."""
        labels = {
            "model": result.model,
            "tier": result.tier,
            "priority": str(priority),
            "bucket": str(result.bucket),
            "variant": result.variant,
        }
        for stage, ms in breakdown_ms.items():
            name = stage.removesuffix("_ms")
            self.stages.labels(**labels, stage=name).observe(ms / 1000)
        if "total_ms" in breakdown_ms:
            self.total.labels(**labels).observe(breakdown_ms["total_ms"] / 1000)
        if "queue_ms" in breakdown_ms:
            self.queue.labels(**labels).observe(breakdown_ms["queue_ms"] / 1000)
        if "compute_ms" in breakdown_ms:
            self.compute.labels(**labels).observe(breakdown_ms["compute_ms"] / 1000)
