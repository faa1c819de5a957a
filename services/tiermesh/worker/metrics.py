"""The worker's metrics: batch sizes and compute time per stream, tokens and rows computed
(rate() gives tokens per second), busy time (rate() gives utilisation), skipped requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, STREAM_LABELS, stream_labels


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
        # Which execution provider each unit's session got (core/sessions.py), as a label:
        # the provider asked for can differ (a CPU fallback is allowed by a setting).
        self.session_info = Gauge(
            "tiermesh_worker_session_info",
            "1 for the execution provider the compute unit's onnxruntime session got",
            ("model", "version", "variant", "tier", "provider"),
            registry=registry,
        )
        self._providers: dict[tuple[ComputeUnit, str], str] = {}
        self.skipped = Counter(
            "tiermesh_requests_skipped",
            "Requests dropped before compute, by reason",
            [*STREAM_LABELS, "reason"],
            registry=registry,
        )

    def unit_loaded(self, unit: ComputeUnit, tier: str, loaded: bool, provider: str = "") -> None:
        """1 while this worker has a session for the unit and reads its streams; 0 once
        model control unloaded it and the session was dropped. `provider`: the execution
        provider the session got (`session_provider`)."""
        model, version, variant = unit.labels
        self.loaded.labels(model, version, variant, tier).set(1 if loaded else 0)
        self.session_provider(unit, tier, provider if loaded else "")

    def session_provider(self, unit: ComputeUnit, tier: str, provider: str) -> None:
        """tiermesh_worker_session_info: 1 labelled with the provider the unit's session got
        ("": the unit has no session any more; its series goes)."""
        model, version, variant = unit.labels
        before = self._providers.pop((unit, tier), None)
        if before is not None and before != provider:
            self.session_info.remove(model, version, variant, tier, before)
        if provider:
            self._providers[unit, tier] = provider
            self.session_info.labels(model, version, variant, tier, provider).set(1)

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


# Seconds between a generative request's tokens: tens of ms on a CPU, seconds when slow.
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)


class GenerationMetrics:
    """A generative unit's: time to first token and per output token, tokens by kind, and
    the engine's load (sequences running, KV-pool tokens reserved)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("model", "version", "variant")
        self.ttft = Histogram(
            "tiermesh_generation_ttft_seconds",
            "Time to first token, from the worker taking the request",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "tiermesh_generation_tpot_seconds",
            "Mean time per output token after the first, per request",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "tiermesh_generation_tokens",
            "Prompt and generated tokens of finished requests",
            [*labels, "kind"],
            registry=registry,
        )
        self.ended = Counter(
            "tiermesh_generation_requests",
            "Generation requests ended, by how (stop, length, stop_string, cancelled, ...)",
            [*labels, "reason"],
            registry=registry,
        )
        self.sequences = Gauge(
            "tiermesh_generation_sequences",
            "Sequences running in the engine",
            labels,
            registry=registry,
        )
        self.kv_tokens = Gauge(
            "tiermesh_generation_kv_reserved_tokens",
            "KV-pool tokens reserved by running sequences",
            labels,
            registry=registry,
        )

    def finished(
        self,
        unit: ComputeUnit,
        reason: str,
        prompt: int,
        generated: int,
        ttft_s: float,
        tpot_s: float,
    ) -> None:
        labels = unit.labels
        self.ended.labels(*labels, reason).inc()
        self.tokens.labels(*labels, "prompt").inc(prompt)
        self.tokens.labels(*labels, "generated").inc(generated)
        if generated:
            self.ttft.labels(*labels).observe(ttft_s)
        if generated > 1:
            self.tpot.labels(*labels).observe(tpot_s)

    def load(self, unit: ComputeUnit, sequences: int, kv_tokens: int) -> None:
        labels = unit.labels
        self.sequences.labels(*labels).set(sequences)
        self.kv_tokens.labels(*labels).set(kv_tokens)
