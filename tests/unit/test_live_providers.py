"""ModelConfig's `execution_providers_live`: which compute units and tiers are read, and
how the live workers' providers are counted (pure; the Redis read is in
tests/integration/test_live_providers.py)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from tests.conftest import MODELS
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.model_config import ModelConfig, parse_config
from tiermesh.gateway.live_providers import UnitOnTier, count_live, parameter_value, served_units

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def _named(units: list[tuple[ComputeUnit, str]]) -> list[tuple[str, str]]:
    return [(str(u), tier) for u, tier in units]


def mlp(**changes: Any) -> ModelConfig:
    raw = yaml.safe_load((MODELS / "mlp" / "config.yaml").read_text())
    return parse_config({**raw, **changes}, "test")


def test_expired_members_fields_are_not_counted() -> None:
    # w2's heartbeat expired (not a live member) but its field is still in the hash.
    counts = count_live(
        [UnitOnTier("center", frozenset({"w1", "w3"}), {"w1": CPU, "w2": CPU, "w3": CUDA})]
    )
    assert counts == {"center": {CPU: 1, CUDA: 1}}


def test_live_members_without_a_provider_are_not_counted() -> None:
    # w2 is live but published none (a session not opened yet): the tier still shows.
    counts = count_live([UnitOnTier("edge", frozenset({"w1", "w2"}), {"w1": CPU, "w3": CPU})])
    assert counts == {"edge": {CPU: 1}}
    assert count_live([UnitOnTier("edge", frozenset({"w2"}), {})]) == {"edge": {}}


def test_a_worker_counts_once_per_provider_and_tier() -> None:
    counts = count_live(
        [
            UnitOnTier("center", frozenset({"w1", "w2"}), {"w1": CPU, "w2": CUDA}),
            # w1 again (another unit on the same tier): still one CPU worker there.
            UnitOnTier("center", frozenset({"w1"}), {"w1": CPU}),
            UnitOnTier("edge", frozenset({"e1"}), {"e1": CPU}),
        ]
    )
    assert counts == {"center": {CPU: 1, CUDA: 1}, "edge": {CPU: 1}}
    assert json.loads(parameter_value(counts)) == counts


def test_a_model_without_tiers_is_read_on_the_default_tier() -> None:
    assert served_units(mlp()) == [(ComputeUnit("mlp", "1", "fp32"), keys.DEFAULT_TIER)]


def test_each_tier_is_read_with_the_variant_it_serves() -> None:
    sha = "0" * 64
    cfg = mlp(
        variants={"fp32": "model.onnx", "int8": "model.int8.onnx"},
        tiers={"mixed_variants": True, "edge": {"variant": "int8"}, "center": {}},
        versions={"1": {"model.onnx": sha, "model.int8.onnx": sha}},
    )
    assert _named(served_units(cfg)) == [("mlp@1.int8", "edge"), ("mlp@1.fp32", "center")]


def test_a_named_version_is_read_and_an_unknown_one_is_not() -> None:
    raw = yaml.safe_load((MODELS / "mlp" / "config.yaml").read_text())
    sha = raw["versions"]["1"]
    cfg = mlp(versions={"1": sha, "2": sha}, stable_version="1")
    assert _named(served_units(cfg)) == [("mlp@1.fp32", "center")]
    assert _named(served_units(cfg, "2")) == [("mlp@2.fp32", "center")]
    assert _named(served_units(cfg, "9")) == []
