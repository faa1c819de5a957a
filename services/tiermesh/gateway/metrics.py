"""The gateway's metrics: requests by status code, latencies by model/tier/priority/bucket/
variant from each answer's own timeline, in-flight requests, response-cache lookups, auth
and quota refusals, lost audit entries, the adaptive limits by class."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tiermesh.core.jobs import JobResult
from tiermesh.core.metrics import LATENCY_BUCKETS, REQUEST_LABELS
from tiermesh.gateway.adaptive_limit import AdaptiveLimits

# model, tier, priority, bucket, variant (REQUEST_LABELS)
SeriesKey = tuple[str, str, int, int, str]


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry
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
        # total, queue, compute and every stage of each answer's timeline (Timeline).
        self._timeline = Timeline(registry)
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
        # The OpenAI door's calls (gateway/openai_door.py): its own, since its status is an
        # HTTP one and a call of a list may be several jobs; `model` is a known name or
        # "unknown", `endpoint` one of its routes.
        self.openai_calls = Counter(
            "tiermesh_openai_requests",
            "Calls of the OpenAI door, by endpoint, model and HTTP status",
            ["endpoint", "model", "status"],
            registry=registry,
        )
        self.openai_rows = Counter(
            "tiermesh_openai_embedding_inputs",
            "Inputs (texts or token-id lists) embedded through the OpenAI door, by model",
            ["model"],
            registry=registry,
        )
        # Children of the labelled metrics by their labels, looked up once (all bounded: the
        # repository's models, the status codes, the tiers, buckets and variants).
        self._answered: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._lookups: dict[tuple[str, bool], Counter] = {}

    def watch_limits(self, limits: AdaptiveLimits) -> None:
        """Export the adaptive limits' state at every scrape (LimitsCollector)."""
        self._registry.register(LimitsCollector(limits))

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
        self._timeline.observe(key, breakdown_ms)


# The histograms of Timeline: name, help, the breakdown's stage it reads ("" = every stage,
# with a `stage` label).
TIMELINE_HISTOGRAMS = (
    ("tiermesh_request_duration_seconds", "Received to answered, per request", "total_ms"),
    ("tiermesh_queue_duration_seconds", "Time in the work stream, per request", "queue_ms"),
    ("tiermesh_compute_duration_seconds", "Compute time of the request's batch", "compute_ms"),
    ("tiermesh_stage_duration_seconds", "Every stage of the per-request timeline", ""),
)


class Timeline(Collector):
    """The latency histograms of every answer (TIMELINE_HISTOGRAMS), by REQUEST_LABELS, as
    plain counts per bucket. An answer makes ten observations; prometheus_client's Histogram
    takes a lock for each bucket increment and sum, which made them an eighth of the
    gateway's CPU under load (py-spy, the mlp at capacity: the door's answers are booked
    here in batches). Only the event loop's thread observes; a scrape (the metrics server's
    thread) reads the counts as they are, so a series may be one answer behind its sum.
    Same names, labels and buckets as the Histograms before it (no `_created` series)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._bounds = LATENCY_BUCKETS
        # (labels, the breakdown's stage) -> its observations per bucket and their sum
        self._series: dict[tuple[SeriesKey, str], _Counts] = {}
        registry.register(self)

    def observe(self, key: SeriesKey, breakdown_ms: dict[str, float]) -> None:
        series = self._series
        bounds = self._bounds
        for stage, ms in breakdown_ms.items():
            counts = series.get((key, stage))
            if counts is None:
                counts = series[(key, stage)] = _Counts(len(bounds) + 1)
            seconds = ms / 1000
            counts.buckets[bisect_left(bounds, seconds)] += 1
            counts.sum += seconds

    def describe(self) -> Iterator[Metric]:
        for name, doc, stage in TIMELINE_HISTOGRAMS:
            yield HistogramMetricFamily(name, doc, labels=_labels(stage))

    def collect(self) -> Iterator[Metric]:
        families = {
            stage: HistogramMetricFamily(name, doc, labels=_labels(stage))
            for name, doc, stage in TIMELINE_HISTOGRAMS
        }
        every = families[""]
        edges = [repr(float(b)) for b in self._bounds] + ["+Inf"]  # as prometheus_client
        for (key, stage), counts in list(self._series.items()):
            model, tier, priority, bucket, variant = key
            labels = [model, tier, str(priority), str(bucket), variant]
            buckets = list(zip(edges, accumulate(counts.buckets), strict=True))
            every.add_metric([*labels, stage.removesuffix("_ms")], buckets, counts.sum)
            main = families.get(stage)
            if main is not None:
                main.add_metric(labels, buckets, counts.sum)
        yield from families.values()


class _Counts:
    """One series: observations per bucket (not cumulative; the last: above every bound)."""

    __slots__ = ("buckets", "sum")

    def __init__(self, n: int) -> None:
        self.buckets = [0] * n
        self.sum = 0.0


def _labels(stage: str) -> list[str]:
    return [*REQUEST_LABELS, "stage"] if stage == "" else list(REQUEST_LABELS)


class LimitsCollector(Collector):
    """Scrape-time gauges of the adaptive limits (gateway/adaptive_limit.py), by model and
    priority: the limit, the drain rate the drain cap reads, the calls in flight. The Go
    front door exports the same series for the calls it takes."""

    def __init__(self, limits: AdaptiveLimits) -> None:
        self._limits = limits

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "priority"]
        limit = GaugeMetricFamily(
            "tiermesh_admission_limit",
            "Adaptive in-flight limit, by model and priority",
            labels=labels,
        )
        drain = GaugeMetricFamily(
            "tiermesh_admission_drain_per_second",
            "Requests a second the class drained while held back or late (0: not yet measured)",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "tiermesh_admission_in_flight", "Requests of the class in flight", labels=labels
        )
        for (model, priority), lim, rate, n in self._limits.classes():
            values = [model, str(priority)]
            limit.add_metric(values, lim)
            drain.add_metric(values, rate)
            in_flight.add_metric(values, n)
        yield from (limit, drain, in_flight)
