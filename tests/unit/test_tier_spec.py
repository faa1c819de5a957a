"""One model name, one answer: a config whose tiers serve different variants is refused
unless it opts in (`tiers.mixed_variants: true`); a caller naming a variant gets it on any
tier; the committed MiniLM configs serve FP32 on both tiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from tiermesh.core.jobs import Job
from tiermesh.core.model_config import RepositoryError, companions, parse_config
from tiermesh.core.tensors import from_numpy
from tiermesh.core.tier_spec import TierSpec
from tiermesh.router.routing import tier_stream

ROOT = Path(__file__).resolve().parents[2]


def _raw(tiers: Any, **over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "clf",
        "max_batch_size": 8,
        "inputs": [{"name": "X", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "LOGITS", "datatype": "FP32", "dims": [3]}],
        "variants": {"fp32": "model.onnx", "int8": "model.int8.onnx"},
        "default_variant": "fp32",
        "versions": {"1": {"model.onnx": "a" * 64, "model.int8.onnx": "b" * 64}},
        "tiers": tiers,
    }
    raw.update(over)
    return raw


def _refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(RepositoryError) as exc:
        parse_config(raw, "clf/config.yaml")
    return str(exc.value)


@pytest.mark.parametrize("model", ["minilm-l6", "minilm-l3"])
def test_committed_minilm_configs_serve_fp32_on_both_tiers(model: str) -> None:
    path = ROOT / "models" / model / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    cfg = parse_config(raw, str(path))
    assert cfg.tier_variants == {"edge": "fp32", "center": "fp32"}
    assert not cfg.mixed_variants
    assert [(t.name, t.max_cost) for t in cfg.tiers] == [("edge", 64), ("center", 0)]
    assert "int8" in cfg.variants  # still there for callers that name it
    (ids,) = companions(raw, cfg, str(path))
    assert ids.tier_variants == cfg.tier_variants


@pytest.mark.parametrize(
    "tiers",
    [
        {"edge": {"variant": "int8", "max_cost": 64}, "center": {"variant": "fp32"}},
        # A tier naming no variant serves the default one: still two variants.
        {"edge": {"variant": "int8", "max_cost": 64}, "center": {}},
        {"edge": {"max_cost": 64}, "center": {"variant": "int8"}},
        {"edge": {"variant": "int8"}, "center": {}, "mixed_variants": False},
    ],
)
def test_tiers_serving_different_variants_are_refused(tiers: dict[str, Any]) -> None:
    message = _refusal(_raw(tiers))
    assert message.startswith("clf/config.yaml: tiers serve different variants (edge: ")
    assert "mixed_variants: true" in message
    assert "`variant` parameter" in message


def test_the_issue_20_config_is_refused() -> None:
    """The MiniLM config as it was (edge INT8, center FP32) no longer loads."""
    raw = yaml.safe_load((ROOT / "models" / "minilm-l6" / "config.yaml").read_text())
    raw["tiers"]["edge"]["variant"] = "int8"
    assert "(edge: int8, center: fp32)" in _refusal(raw)


@pytest.mark.parametrize(
    "tiers",
    [
        {"edge": {"variant": "fp32", "max_cost": 64}, "center": {"variant": "fp32"}},
        {"edge": {"max_cost": 64}, "center": {}},
        {"edge": {"max_cost": 64}, "center": {"variant": "fp32"}},  # fp32 is the default
        {"center": {"variant": "int8"}},  # one tier, one variant
    ],
)
def test_one_variant_on_every_tier_needs_no_opt_in(tiers: dict[str, Any]) -> None:
    cfg = parse_config(_raw(tiers), "clf/config.yaml")
    assert len(set(cfg.tier_variants.values())) == 1
    assert not cfg.mixed_variants


def test_mixed_variants_opt_in() -> None:
    tiers = {"mixed_variants": True, "edge": {"variant": "int8", "max_cost": 64}, "center": {}}
    cfg = parse_config(_raw(tiers), "clf/config.yaml")
    assert cfg.mixed_variants
    # The flag is no tier: the tiers are the two named, in the order written.
    assert cfg.tiers == (TierSpec("edge", "int8", 64), TierSpec("center", ""))
    assert cfg.tier_variants == {"edge": "int8", "center": "fp32"}


@pytest.mark.parametrize(
    ("tiers", "words"),
    [
        (
            {"mixed_variants": "yes", "center": {}},
            "mixed_variants: Input should be a valid boolean",
        ),
        ({"mixed_variants": 1, "center": {}}, "mixed_variants: Input should be a valid boolean"),
        ({"fog": {}, "center": {}}, "unknown key 'fog'; allowed keys: center, edge, mixed"),
        ({"edge": {"variant": "fp16"}, "center": {}}, "unknown variant fp16"),
        ({"edge": {"max_cost": -1}, "center": {}}, "max_cost must be >= 0"),
    ],
)
def test_bad_tiers_are_refused(tiers: dict[str, Any], words: str) -> None:
    message = _refusal(_raw(tiers))
    assert message.startswith("clf/config.yaml: ") and words in message


def test_a_cascade_over_two_variants_needs_the_opt_in() -> None:
    """A cascade is for a cheaper edge variant; over one variant it is allowed (the re-run
    answers the same, tests/conftest.py's mlp_cascade)."""
    cascade = {"output": "LOGITS", "threshold": 0.9}
    two = {"edge": {"variant": "int8", "max_cost": 0}, "center": {}}
    assert "tiers serve different variants" in _refusal(_raw(two, cascade=cascade))
    cfg = parse_config(_raw({**two, "mixed_variants": True}, cascade=cascade), "c.yaml")
    assert cfg.cascade is not None and cfg.tier_variants == {"edge": "int8", "center": "fp32"}
    one = parse_config(_raw({"edge": {"max_cost": 0}, "center": {}}, cascade=cascade), "c.yaml")
    assert one.cascade is not None and set(one.tier_variants.values()) == {"fp32"}


def _job(variant: str = "") -> Job:
    return Job(
        request_id="r",
        model="clf",
        inputs=(from_numpy("X", np.zeros((1, 4), np.float32), "FP32"),),
        gateway="g",
        variant=variant,
    )


def test_every_tier_runs_the_same_unit_unless_the_caller_names_a_variant() -> None:
    cfg = parse_config(_raw({"edge": {"max_cost": 64}, "center": {}}), "clf/config.yaml")
    units = {str(tier_stream(cfg, _job(), t).unit) for t in cfg.tiers}
    assert units == {"clf@1.fp32"}
    named = {(t.name, str(tier_stream(cfg, _job("int8"), t).unit)) for t in cfg.tiers}
    assert named == {("edge", "clf@1.int8"), ("center", "clf@1.int8")}


def test_mixed_tiers_run_their_own_variant_and_a_named_one_wins() -> None:
    tiers = {"mixed_variants": True, "edge": {"variant": "int8", "max_cost": 64}, "center": {}}
    cfg = parse_config(_raw(tiers), "clf/config.yaml")
    edge, center = cfg.tiers
    assert str(tier_stream(cfg, _job(), edge).unit) == "clf@1.int8"
    assert str(tier_stream(cfg, _job(), center).unit) == "clf@1.fp32"
    assert str(tier_stream(cfg, _job("fp32"), edge).unit) == "clf@1.fp32"
