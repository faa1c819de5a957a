"""Compute units with versions, rollout state transitions, window stats, drift pairing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import copy_repository
from tiermesh.core.canary_spec import CanarySpec, parse_canary
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.core.tensors import TensorData, from_numpy
from tiermesh.rollout import state as transitions
from tiermesh.rollout.changes import change_of, version_checksum
from tiermesh.rollout.drift import ShadowPairs, cosine
from tiermesh.rollout.state import RolloutError, RolloutState
from tiermesh.rollout.window import (
    WindowCounts,
    bucket_upper_ms,
    latency_bucket,
    stats_of,
    window_seconds,
)


@pytest.fixture(scope="module")
def cfg(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    root = copy_repository(tmp_path_factory.mktemp("m"), rollout_model="mv")
    return ModelRepository(Path(root)).load()["mv"]


def test_config_names_stable_version_and_canary_thresholds(cfg: ModelConfig) -> None:
    assert cfg.stable.version == "1" and cfg.version("") == cfg.stable
    assert cfg.latest.version == "3"
    assert cfg.canary.min_requests == 10 and cfg.canary.mirror_fraction == 0.5


def test_canary_spec_round_trips_and_refuses_nonsense() -> None:
    spec = CanarySpec(window_s=7.5, min_pairs=2)
    assert CanarySpec.from_strings(spec.as_strings()) == spec
    with pytest.raises(ValueError):
        parse_canary({"max_error_rate": 2})
    with pytest.raises(ValueError):
        parse_canary({"windw_s": 1})


def test_start_promote_rollback(cfg: ModelConfig) -> None:
    started = transitions.start(cfg, None, "2", 10, now_ms=1000)
    assert (started.stable, started.canary, started.state, started.rev) == ("1", "2", "running", 1)
    assert started.thresholds == cfg.canary
    assert RolloutState.from_fields(started.to_fields()) == started
    with pytest.raises(RolloutError, match="is running"):
        transitions.start(cfg, started, "3", 10, now_ms=2000)
    promoted = transitions.promote(started, now_ms=3000)
    assert (promoted.stable, promoted.percent, promoted.state) == ("2", 100.0, "promoted")
    assert transitions.effective_stable(cfg, promoted) == "2"
    # The next rollout starts from the promoted version.
    again = transitions.start(cfg, promoted, "3", 5, now_ms=4000)
    assert (again.stable, again.canary, again.rev) == ("2", "3", 3)
    back = transitions.roll_back(again, now_ms=5000)
    assert (back.state, back.percent, back.stable) == ("rolled_back", 0.0, "2")
    with pytest.raises(RolloutError, match="nothing to roll back"):
        transitions.roll_back(back, now_ms=6000)


@pytest.mark.parametrize(
    ("canary", "percent", "match"),
    [("9", 10, "no version"), ("1", 10, "already the stable"), ("2", 101, "0..100")],
)
def test_start_refuses(cfg: ModelConfig, canary: str, percent: float, match: str) -> None:
    with pytest.raises(RolloutError, match=match):
        transitions.start(cfg, None, canary, percent, now_ms=0)


def test_change_records_checksums_of_the_versions(cfg: ModelConfig) -> None:
    started = transitions.start(cfg, None, "2", 10, now_ms=1000)
    change = change_of(cfg, started, "start", "ana")
    assert change.canary_sha256 == version_checksum(cfg, "2") != version_checksum(cfg, "1")
    assert len(change.canary_sha256) == 64 and change.who == "ana" and change.time_ms == 1000


def test_window_counts_sum_to_version_stats() -> None:
    counts = WindowCounts()
    for i in range(98):
        counts.outcome("m", "2", 100, "OK", latency_ms=1.0 + i * 0.01)
    counts.outcome("m", "2", 101, "OK", latency_ms=80.0)
    counts.outcome("m", "2", 101, "ABORTED", latency_ms=3.0)
    counts.outcome("m", "2", 101, "CANCELLED", latency_ms=3.0)
    counts.cosine("m", "2", 101, 0.5)
    counts.cosine("m", "2", 101, 0.7)
    ints, floats = counts.drain()
    assert not counts
    hashes = [
        {k: str(v) for k, v in {**ints[b], **floats.get(b, {})}.items()} for b in sorted(ints)
    ]
    stats = stats_of(hashes)
    assert (stats.answers, stats.errors, stats.ok) == (100, 1, 99)
    assert stats.p99_ms() == bucket_upper_ms(latency_bucket(80.0)) >= 80.0
    assert stats.quantile_ms(0.5) == pytest.approx(bucket_upper_ms(latency_bucket(1.5)))
    assert stats.cosine_n == 2 and stats.cosine_mean == pytest.approx(0.6)


def test_window_never_reaches_before_the_rollout_started() -> None:
    assert window_seconds(1000.4, 10) == range(991, 1001)
    assert window_seconds(1000.4, 10, since_ms=997_500) == range(997, 1001)


def _out(*values: float) -> tuple[TensorData, ...]:
    return (from_numpy("OUTPUT0", np.array([values], np.float32), "FP32"),)


def test_cosine_of_outputs() -> None:
    assert cosine(_out(1, 2, 3), _out(2, 4, 6)) == pytest.approx(1.0)
    assert cosine(_out(1, 0), _out(0, 1)) == pytest.approx(0.0)
    assert cosine(_out(1, 0), _out(1, 0, 0)) is None


def test_shadow_pairs_meet_in_either_order_and_expire() -> None:
    pairs = ShadowPairs()
    pairs.expect("a", "m", deadline_ns=100, now_ns=0)
    pairs.expect("b", "m", deadline_ns=100, now_ns=0)
    assert pairs.primary("a", _out(1, 0)) is None
    got = pairs.shadow("a", "2", _out(1, 0))
    assert got is not None and (got.model, got.canary_version) == ("m", "2")
    assert pairs.shadow("b", "2", _out(0, 1)) is None
    got = pairs.primary("b", _out(1, 0))
    assert got is not None and got.similarity == pytest.approx(0.0)
    pairs.expect("c", "m", deadline_ns=100, now_ns=0)
    pairs.expect("d", "m", deadline_ns=300, now_ns=200)  # c expired meanwhile
    assert len(pairs) == 1 and pairs.shadow("c", "2", _out(1)) is None


def test_rollout_state_ignores_an_unknown_phase() -> None:
    raw = dataclasses.replace(RolloutState(model="m", stable="1"), rev=2).to_fields()
    raw["state"] = "weird"
    assert RolloutState.from_fields(raw).state == "none"
