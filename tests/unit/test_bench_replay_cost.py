"""Replay schedules and inputs from a capture, cost arithmetic and prices, and the alert
gauges of the router's health collector (pure parts, no network)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tiermesh.bench import compare, cost, replay
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.prices import (
    CORE_HOUR,
    DEFAULT_PRICES,
    NODE_HOUR,
    Prices,
    TierPrice,
    parse_prices,
)
from tiermesh.router.health_metrics import HealthReading, entry_ms, families


def rec(t_ms: float, priority: int = 1, tokens: int | None = None, words: int = 0) -> dict:
    text = {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "bytes": 40, "words": words}
    out: dict = {"t_ms": t_ms, "model": "echo", "priority": priority, "inputs": [text]}
    if tokens is not None:
        out["tokens"] = tokens
    return out


def test_schedule_keeps_the_captured_gaps_scaled_by_speed() -> None:
    records = [rec(1000.0), rec(1100.0), rec(1400.0)]
    assert replay.schedule(records) == pytest.approx([0.0, 0.1, 0.4])
    assert replay.schedule(records, speed=2) == pytest.approx([0.0, 0.05, 0.2])
    with pytest.raises(ValueError):
        replay.schedule(records, speed=0)


def test_load_sorts_and_replayable_leaves_out_refused_requests(tmp_path: Path) -> None:
    refused = {"t_ms": 5.0, "model": "echo", "priority": None, "inputs": []}
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (rec(9.0), refused, rec(1.0))) + "\n")
    loaded = replay.load(path)
    assert [r["t_ms"] for r in loaded] == [1.0, 5.0, 9.0]
    keep, skipped = replay.replayable(loaded)
    assert len(keep) == 2 and skipped == 1
    assert replay.replayable(loaded, model="mlp") == ([], 3)
    (tmp_path / "bad.jsonl").write_text("{}\n")
    with pytest.raises(ValueError):
        replay.load(tmp_path / "bad.jsonl")


def test_synthesised_inputs_have_the_captured_sizes_and_priorities() -> None:
    records = [
        rec(0, priority=1, tokens=12),  # 10 words + [CLS] + [SEP]
        rec(1, priority=2, words=45),  # no token count: the word count
        {
            "t_ms": 2,
            "model": "mlp",
            "priority": 1,
            "inputs": [{"name": "X", "datatype": "FP32", "shape": [3, 4], "bytes": 48}],
        },
    ]
    specs = list(replay.CaptureWorkload(records, seed=1))
    assert [s.priority for s in specs] == [1, 2, 1]
    assert [s.length for s in specs] == ["short", "medium", "numeric"]
    assert len(specs[0].inputs[0].array[0, 0].split()) == 10
    assert len(specs[1].inputs[0].array[0, 0].split()) == 45
    assert specs[2].inputs[0].array.shape == (3, 4)
    assert str(specs[2].inputs[0].array.dtype) == "float32"


def test_histograms_bin_sizes_and_priorities() -> None:
    records = [rec(0, 1, tokens=12), rec(1, 2, tokens=14), rec(2, 2, tokens=60)]
    assert replay.histogram(records, "size") == pytest.approx(
        {"tokens<=16": 2 / 3, "tokens<=64": 1 / 3}
    )
    assert replay.histogram(records, "priority") == pytest.approx({"1": 1 / 3, "2": 2 / 3})


PRICES = Prices("EUR", {"center": TierPrice(CORE_HOUR, 0.05), "edge": TierPrice(NODE_HOUR, 0.02)})


def test_cost_prices_core_hours_and_node_hours() -> None:
    usages = [
        cost.TierUsage("center", replicas=3, cpu_s=72.0, wall_s=60.0),  # 0.02 core-hours
        cost.TierUsage("edge", replicas=2, cpu_s=10.0, wall_s=90.0),  # 0.05 node-hours
        cost.TierUsage("gpu", replicas=1, cpu_s=5.0, wall_s=60.0),  # not priced
    ]
    doc = cost.cost(usages, PRICES, requests_ok=500, tokens=20_000)
    assert doc["currency"] == "EUR"
    assert [r["cost"] for r in doc["tiers"]] == pytest.approx([0.001, 0.001, 0.0])
    assert doc["tiers"][0]["cores_used"] == pytest.approx(1.2)
    assert doc["total"] == pytest.approx(0.002)
    assert doc["per_1k_requests"] == pytest.approx(0.004)
    assert doc["per_million_tokens"] == pytest.approx(0.1)
    empty = cost.cost(usages, PRICES, requests_ok=0, tokens=0)
    assert math.isnan(empty["per_1k_requests"]) and math.isnan(empty["per_million_tokens"])


def test_usage_from_cpu_readings_and_targets() -> None:
    targets = cost.parse_targets(["center=http://a/m,http://b/m", "edge=http://c/m"])
    assert targets == {"center": ("http://a/m", "http://b/m"), "edge": ("http://c/m",)}
    with pytest.raises(ValueError):
        cost.parse_targets(["center"])
    before = {"http://a/m": 1.0, "http://b/m": 2.0, "http://c/m": 5.0}
    after = {"http://a/m": 3.5, "http://b/m": 2.5, "http://c/m": math.nan}
    center, edge = cost.usage(targets, before, after, wall_s=10.0)
    assert (center.replicas, center.cpu_s) == (2, pytest.approx(3.0))
    assert edge.replicas == 1 and math.isnan(edge.cpu_s)
    text = "# HELP x\nprocess_cpu_seconds_total 12.5\nprocess_cpu_seconds_total_x 1\n"
    assert cost.read_cpu({"t": ["u"]}, fetcher=lambda url: text) == {"u": 12.5}


def test_prices_file_parses_and_refuses_both_units() -> None:
    prices = parse_prices("currency: USD\ntiers:\n  center: {per_core_hour: 0.1}\n")
    assert prices.tiers == {"center": TierPrice(CORE_HOUR, 0.1)}
    with pytest.raises(ValueError):
        parse_prices("tiers:\n  center: {per_core_hour: 0.1, per_node_hour: 1}\n")
    shipped = Path(__file__).resolve().parents[2] / "deploy" / "prices.yaml"
    assert parse_prices(shipped.read_text()) == DEFAULT_PRICES


def test_compare_shows_the_change_of_cost_and_flags_a_rise() -> None:
    base = {
        "overall": {},
        "cost": {"currency": "USD", "per_1k_requests": 0.010, "per_million_tokens": 1.0},
    }
    dearer = {
        "overall": {},
        "cost": {"currency": "USD", "per_1k_requests": 0.012, "per_million_tokens": 1.05},
    }
    deltas = {d.metric: d for d in compare.compare(base, dearer) if d.scope.startswith("cost")}
    assert deltas["per_1k_requests"].change == pytest.approx(0.2)
    assert deltas["per_1k_requests"].regression
    assert not deltas["per_million_tokens"].regression
    text = compare.render("A", "B", list(deltas.values()), [])
    assert "per_1k_requests" in text and "+20.0%" in text


def test_health_gauges_from_a_reading() -> None:
    key = StreamKey(ComputeUnit.parse("mlp@1.fp32"), "center", 1, 0)
    reading = HealthReading(
        oldest_ms={key: 1_000},
        dead_letters={(key.unit, "center"): 3},
        live_workers={(key.unit, "center"): 2},
        memory={"used_memory": 100, "maxmemory": 0},
    )
    got = {
        f.name: [(s.labels, s.value) for s in f.samples] for f in families(reading, now_ms=3_500)
    }
    ((labels, age),) = got["tiermesh_queue_oldest_age_seconds"]
    assert age == 2.5 and labels["model"] == "mlp" and labels["priority"] == "1"
    assert got["tiermesh_dead_letters"][0][1] == 3
    assert got["tiermesh_workers_live"][0][1] == 2
    assert got["tiermesh_redis_memory_used_bytes"][0][1] == 100
    assert entry_ms(b"1712345678901-3") == 1712345678901
