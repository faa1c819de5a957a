"""The worker's metrics: batch sizes and compute time per stream, tokens and rows computed
(rate() gives tokens per second), busy time (rate() gives utilisation), skipped requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiermesh.core.keys import StreamKey, split_unit
from tiermesh.core.metrics import BATCH_BUCKETS, LATENCY_BUCKETS

STREAM_LABELS = ("model", "version", "variant", "tier", "priority", "bucket")


def stream_labels(key: StreamKey) -> dict[str, str]:
    model, version, variant = split_unit(key.model)
    return {
        "model": model,
        "version": version,
        "variant": variant,
        "tier": key.tier,
        "priority": str(key.priority),
        "bucket": str(key.bucket),
    }


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.batch_rows = Histogram(
            "tiermesh_batch_size",
            "Rows per computed batch",
            STREAM_LABELS,
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "tiermesh_batch_compute_seconds",
            "onnxruntime time per batch",
            STREAM_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.rows = Counter(
            "tiermesh_rows_computed", "Rows computed", STREAM_LABELS, registry=registry
        )
        self.tokens = Counter(
            "tiermesh_tokens_computed",
            "Real (unpadded) tokens computed",
            STREAM_LABELS,
            registry=registry,
        )
        self.padded_tokens = Counter(
            "tiermesh_padded_tokens_computed",
            "Tokens computed including batch padding",
            STREAM_LABELS,
            registry=registry,
        )
        self.busy = Counter(
            "tiermesh_worker_busy_seconds",
            "Time spent computing (rate = utilisation)",
            registry=registry,
        )
        self.loaded = Gauge(
            "tiermesh_worker_model_loaded",
            "1 while the worker serves the compute unit (a session, its streams read)",
            ("model", "version", "variant", "tier"),
            registry=registry,
        )
        self.skipped = Counter(
            "tiermesh_requests_skipped",
            "Requests dropped before compute, by reason",
            [*STREAM_LABELS, "reason"],
            registry=registry,
        )

    def unit_loaded(self, unit: str, tier: str, loaded: bool) -> None:
        """1 while this worker has a session for the unit and reads its streams; 0 once
        model control unloaded it and the session was dropped."""
        model, version, variant = split_unit(unit)
        self.loaded.labels(model, version, variant, tier).set(1 if loaded else 0)

    def batch(self, key: StreamKey, rows: int, compute_ns: int, tokens: int, padded: int) -> None:
        labels = stream_labels(key)
        self.batch_rows.labels(**labels).observe(rows)
        self.batch_seconds.labels(**labels).observe(compute_ns / 1e9)
        self.rows.labels(**labels).inc(rows)
        if padded:
            self.tokens.labels(**labels).inc(tokens)
            self.padded_tokens.labels(**labels).inc(padded)
        self.busy.inc(compute_ns / 1e9)

    def skip(self, key: StreamKey, reason: str, n: int) -> None:
        self.skipped.labels(**stream_labels(key), reason=reason).inc(n)
