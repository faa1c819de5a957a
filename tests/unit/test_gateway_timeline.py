"""The gateway's answer-latency histograms (gateway/metrics.py Timeline) expose what
prometheus_client's Histogram would for the same observations: names, labels, every bucket,
count and sum, on the text a scrape reads."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tiermesh.core.metrics import LATENCY_BUCKETS, REQUEST_LABELS
from tiermesh.gateway.metrics import TIMELINE_HISTOGRAMS, Timeline

STAGES = ("preprocess_ms", "queue_ms", "batch_wait_ms", "compute_ms", "total_ms")


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every histogram sample a scrape reads (no `_created`: ours has none to offer)."""
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if family.type == "histogram"
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_the_timeline_exposes_what_histograms_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    timeline = Timeline(ours)
    histograms = {
        stage: Histogram(
            name,
            doc,
            [*REQUEST_LABELS, "stage"] if not stage else list(REQUEST_LABELS),
            buckets=LATENCY_BUCKETS,
            registry=theirs,
        )
        for name, doc, stage in TIMELINE_HISTOGRAMS
    }
    rng = random.Random(7)
    keys = [("mlp", "center", 2, 0, "fp32"), ("minilm-l6", "edge", 1, 16, "int8")]
    for _ in range(500):
        key = rng.choice(keys)
        # Exactly on a bound (le is inclusive), between bounds, above every bound, and a
        # stage left out (a cache hit has no queue).
        breakdown = {s: rng.choice([0.5, 1.0, 3.7, 42.0, 40_000.0]) for s in STAGES}
        if rng.random() < 0.2:
            del breakdown["queue_ms"]
        timeline.observe(key, breakdown)
        labels = [str(v) for v in key]
        for stage, ms in breakdown.items():
            histograms[""].labels(*labels, stage.removesuffix("_ms")).observe(ms / 1000)
            if stage in histograms:
                histograms[stage].labels(*labels).observe(ms / 1000)
    expected = samples(theirs)
    assert len(expected) > 100
    got = samples(ours)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        if name[0].endswith("_sum"):  # summed in another order
            assert got[name] == pytest.approx(value, rel=1e-12), name
        else:
            assert got[name] == value, name


def test_a_registry_refuses_a_second_timeline() -> None:
    registry = CollectorRegistry()
    Timeline(registry)
    with pytest.raises(ValueError, match="tiermesh_request_duration_seconds"):
        Timeline(registry)
