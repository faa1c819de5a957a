"""The gateway's metrics: requests by status code, latencies by model/tier/priority/bucket/
variant from each answer's own timeline, in-flight requests, response-cache lookups, auth
and quota refusals, lost audit entries."""

from __future__ import annotations

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiermesh.core.jobs import JobResult
from tiermesh.core.metrics import LATENCY_BUCKETS, REQUEST_LABELS

# model, tier, priority, bucket, variant (REQUEST_LABELS)
SeriesKey = tuple[str, str, int, int, str]


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
            "Audit entries that could not be written (calls under way when the queue filled)",
            registry=registry,
        )
        self.audit_refusals = Counter(
            "tiermesh_audit_refusals",
            "Audited calls refused UNAVAILABLE while the audit log could not be written",
            registry=registry,
        )
        # Children of the labelled metrics by their labels, looked up once (all bounded: the
        # repository's models, the status codes, the tiers, buckets and variants).
        self._answered: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._lookups: dict[tuple[str, bool], Counter] = {}
        self._series: dict[SeriesKey, _Series] = {}

    def answered(self, model: str, code: grpc.StatusCode) -> None:
        """Called once as each ModelInfer ends (`model` is a known name or "unknown")."""
        child = self._answered.get((model, code))
        if child is None:
            child = self._answered[(model, code)] = self.requests.labels(model, code.name)
        child.inc()

    def cache_lookup(self, model: str, hit: bool) -> None:
        child = self._lookups.get((model, hit))
        if child is None:
            child = self.cache.labels(model, "hit" if hit else "miss")
            self._lookups[(model, hit)] = child
        child.inc()

    def timeline(self, result: JobResult, priority: int, breakdown_ms: dict[str, float]) -> None:
        """Called once per computed answer with its breakdown (milliseconds)."""
        key = (result.model, result.tier, priority, result.bucket, result.variant)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series(self, key)
        series.observe(breakdown_ms)


class _Series:
    """The histograms of one label set (model, tier, priority, bucket, variant), their
    children looked up once: `labels()` checks and hashes its arguments on every call, which
    cost more than the observations themselves."""

    def __init__(self, metrics: GatewayMetrics, key: SeriesKey) -> None:
        model, tier, priority, bucket, variant = key
        self._labels = (model, tier, str(priority), str(bucket), variant)
        self._stages_metric = metrics.stages
        self._stages: dict[str, Histogram] = {}
        self._main = {
            "total_ms": metrics.total.labels(*self._labels),
            "queue_ms": metrics.queue.labels(*self._labels),
            "compute_ms": metrics.compute.labels(*self._labels),
        }

    def observe(self, breakdown_ms: dict[str, float]) -> None:
        for stage, ms in breakdown_ms.items():
            child = self._stages.get(stage)
            if child is None:
                name = stage.removesuffix("_ms")
                child = self._stages[stage] = self._stages_metric.labels(*self._labels, name)
            child.observe(ms / 1000)
        for stage, child in self._main.items():
            if stage in breakdown_ms:
                child.observe(breakdown_ms[stage] / 1000)
