"""bench stats: percentiles, figures, grouping, time breakdown and time series."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tiermesh.bench import stats
from tiermesh.bench.records import NOT_SENT, OK, Outcome, Record, Reply


def rec(
    latency_ms: float,
    code: str = OK,
    *,
    start_s: float = 0.0,
    length: str = "short",
    priority: int = 2,
    bucket: int | None = 16,
    stages: dict[str, float] | None = None,
    step: int = 0,
    batch_size: int | None = None,
) -> Record:
    reply = (
        Reply(stages_ms=stages or {}, bucket=bucket, batch_size=batch_size) if code == OK else None
    )
    return Record(start_s, length, priority, step, 1, Outcome(code, latency_ms, reply))


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 95, 99, 99.9, 100])
def test_percentile_matches_numpy_linear(q: float) -> None:
    values = list(np.random.default_rng(3).exponential(10.0, size=257))
    assert stats.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edges() -> None:
    assert math.isnan(stats.percentile([], 50))
    assert stats.percentile([7.0], 99) == 7.0
    assert stats.percentile([1.0, 2.0], 50) == 1.5
    assert stats.percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    with pytest.raises(ValueError):
        stats.percentile([1.0], 101)


def test_figures_count_errors_over_sent_and_latency_over_answers() -> None:
    records = [rec(float(i)) for i in range(1, 9)]
    records += [rec(500.0, "RESOURCE_EXHAUSTED"), rec(900.0, "DEADLINE_EXCEEDED")]
    records += [rec(0.0, NOT_SENT)]
    f = stats.figures(records, wall_s=2.0)
    assert (f.sent, f.ok, f.errors, f.not_sent) == (10, 8, 2, 1)
    assert f.error_rate == pytest.approx(0.2)
    assert f.throughput_rps == pytest.approx(4.0)
    assert f.sent_rps == pytest.approx(5.0)
    assert f.max_ms == 8.0  # failures never enter the latency figures
    assert f.p50_ms == pytest.approx(4.5)
    assert f.errors_by_code == {"DEADLINE_EXCEEDED": 1, "RESOURCE_EXHAUSTED": 1}


def test_figures_of_nothing() -> None:
    f = stats.figures([], wall_s=0.0)
    assert (f.sent, f.error_rate, f.throughput_rps) == (0, 0.0, 0.0)
    assert math.isnan(f.p99_ms)


def test_failed_requests_take_the_usual_bucket_of_their_length() -> None:
    records = [
        rec(1.0, length="short", bucket=16),
        rec(1.0, length="short", bucket=16),
        rec(1.0, length="short", bucket=64),  # a short text that tokenized long
        rec(1.0, "UNAVAILABLE", length="short"),
        rec(1.0, length="long", bucket=128),
        rec(1.0, "UNAVAILABLE", length="long"),
        rec(1.0, "UNAVAILABLE", length="medium"),  # none of its class answered
    ]
    assert stats.bucket_labels(records) == ["16", "16", "64", "16", "128", "128", "unknown"]


def test_grouped_rows_per_key_combination_sorted_numerically() -> None:
    records = [rec(1.0, priority=2, bucket=128), rec(2.0, priority=1, bucket=16)]
    records += [rec(3.0, "UNAVAILABLE", priority=1), rec(4.0, priority=1, bucket=16)]
    buckets = stats.bucket_labels(records)
    rows = stats.grouped(
        records, 1.0, {"bucket": buckets, "priority": [r.priority for r in records]}
    )
    assert [(r["bucket"], r["priority"]) for r in rows] == [("16", 1), ("128", 2)]
    assert rows[0]["sent"] == 3 and rows[0]["error_rate"] == pytest.approx(1 / 3)


def test_breakdown_means_per_stage_and_the_rest_outside() -> None:
    records = [
        rec(10.0, stages={"queue": 2.0, "compute": 3.0}),
        rec(20.0, stages={"queue": 4.0, "compute": 5.0}),
        rec(8.0, bucket=64, stages={"queue": 1.0}),
        rec(99.0, "UNAVAILABLE"),
    ]
    out = stats.breakdown(records, stats.bucket_labels(records))
    assert out["16"]["queue"] == pytest.approx(3.0)
    assert out["16"]["compute"] == pytest.approx(4.0)
    assert out["16"]["outside"] == pytest.approx(15.0 - 7.0)
    assert out["16"]["n"] == 2
    assert "compute" not in out["64"]  # absent, not zero
    assert list(out) == ["16", "64"]


def test_breakdown_without_timing_parameters() -> None:
    out = stats.breakdown([rec(5.0)], ["16"])
    assert math.isnan(out["16"]["outside"]) and out["16"]["latency"] == 5.0


def test_mean_batch_size_counts_batches_not_requests() -> None:
    # One batch of 4 (four replies saying 4) and two batches of 1.
    records = [rec(1.0, batch_size=4) for _ in range(4)] + [rec(1.0, batch_size=1)] * 2
    assert stats.server_figures(records)["mean_batch_size"] == pytest.approx(6 / 3)


def test_in_flight_peaks_sweep() -> None:
    # [0, 0.5) [0.2, 1.2) [1.5, 1.6): two at once in window 0, one across window 1.
    records = [rec(500.0, start_s=0.0), rec(1000.0, start_s=0.2), rec(100.0, start_s=1.5)]
    assert stats.in_flight_peaks(records, 1.0, 3) == [2, 1, 0]
    # A request spanning a whole window with no event inside it still counts there.
    assert stats.in_flight_peaks([rec(2500.0, start_s=0.1)], 1.0, 3) == [1, 1, 1]


def test_timeline_windows_by_completion_and_a_short_tail_joins() -> None:
    records = [rec(100.0, start_s=t / 10) for t in range(30)]  # 10/s for 3 s, each 0.1 s
    windows = stats.timeline(records, window_s=1.0, wall_s=3.1)
    assert [w["len_s"] for w in windows] == pytest.approx([1.0, 1.0, 1.1])
    assert windows[0]["sent_rps"] == 10 and windows[0]["throughput_rps"] == 9
    assert sum(w["throughput_rps"] * w["len_s"] for w in windows) == pytest.approx(30)
    assert windows[1]["p50_ms"] == pytest.approx(100.0)
    with pytest.raises(ValueError):
        stats.timeline(records, 0.0, 1.0)


def test_drift_needs_six_windows() -> None:
    flat = [{"throughput_rps": 10.0, "p99_ms": 5.0}] * 5
    assert math.isnan(stats.drift(flat)["throughput_ratio"])
    rising = [{"throughput_rps": 10.0, "p99_ms": 5.0}] * 3 + [
        {"throughput_rps": 5.0, "p99_ms": 10.0}
    ] * 3
    assert stats.drift(rising) == {"throughput_ratio": 0.5, "p99_ratio": 2.0}
