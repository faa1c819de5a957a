"""core/direct_plan: the front door's placement plan names the streams, keys and bounds the
router itself would place a job by on each tier (router/policy.py, router/admission.py), and
exists only for models whose placement needs nothing but the stream and the tier."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiermesh.core import keys
from tiermesh.core.admission_script import ADMISSION_SCRIPT
from tiermesh.core.direct_plan import direct_plan, plan_parameter
from tiermesh.core.jobs import Job
from tiermesh.core.keys import DEFAULT_TIER
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import TensorData
from tiermesh.router.policy import choose_stream, model_streams, tier_stream

TIERS = {"edge": {"max_cost": 64, "variant": "fp32"}, "center": {}}


def tabular_config(**over: Any) -> ModelConfig:
    raw = {
        "name": "tabular",
        "max_batch_size": 32,
        "inputs": [
            {"name": "A", "datatype": "FP32", "dims": [-1]},
            {"name": "B", "datatype": "FP32", "dims": [-1, -1]},
        ],
        "outputs": [{"name": "Y", "datatype": "FP32", "dims": [1]}],
        "versions": {"3": {"model.onnx": "0" * 64}},
        "priority_levels": 3,
        "default_priority": 2,
        "length_buckets": [16, 64, 256],
        **over,
    }
    return parse_config(raw, "test")


def _stream_of(plan: dict[str, Any], job: Job, tier: int = 0) -> str:
    """The door's lookup (frontdoor/go/direct.go, lengthOf and bucketOf), written again here."""
    skip = 1 if plan["batched"] else 0
    length = max((max(t.shape[skip:], default=1) for t in job.inputs), default=1)
    bounds = plan["bounds"]
    bucket = next((i for i, b in enumerate(bounds) if b >= length), len(bounds) - 1)
    return str(plan["tiers"][tier]["streams"][job.priority - 1][max(bucket, 0)])


@pytest.mark.parametrize(
    "over",
    [{}, {"length_buckets": []}, {"max_batch_size": 0}, {"model_queue_bound": 100}],
    ids=["buckets", "no-buckets", "not-batched", "model-bound"],
)
@pytest.mark.parametrize("priority", [1, 2, 3])
@pytest.mark.parametrize(
    "shapes", [[(1, 5), (1, 5, 3)], [(4, 16), (4, 2, 17)], [(2, 300), (2, 1, 1)], [(1,), (1, 1)]]
)
def test_the_plan_places_a_job_where_the_router_would(
    over: dict[str, Any], priority: int, shapes: list[tuple[int, ...]]
) -> None:
    cfg = tabular_config(**over)
    plan = direct_plan(cfg, explicit_control=False)
    assert plan is not None
    inputs = tuple(TensorData(n, "FP32", s, b"") for n, s in zip("AB", shapes, strict=True))
    job = Job("r1", cfg.name, inputs, "gw:1", priority=priority)
    [tier] = plan["tiers"]
    placed = job.with_(variant=tier["variant"], version=plan["version"])
    stream = choose_stream(cfg, placed, DEFAULT_TIER)
    assert _stream_of(plan, job) == stream.name
    assert (tier["name"], tier["max_cost"]) == (stream.tier, 0) == (DEFAULT_TIER, 0)
    assert plan["rate_fields"][stream.bucket] == keys.rate_field(stream.bucket)
    assert tier["workers"] == keys.workers_key(stream.unit, stream.tier)
    assert tier["rate"] == keys.rate_key(stream.unit, stream.tier)
    assert tier["model_streams"] == [s.name for s in model_streams(cfg, stream)]
    assert (plan["queue_bound"], plan["model_bound"]) == (cfg.queue_bound, cfg.model_queue_bound)
    assert plan["enqueued_prefix"] + "r1" == keys.enqueued_key(cfg.queue_model, "r1")
    assert plan["guard"] == keys.rollout_key(cfg.queue_model)


def test_the_plan_names_the_script_the_router_registers() -> None:
    plan = direct_plan(tabular_config(), explicit_control=False)
    assert plan is not None
    assert plan["script"] == ADMISSION_SCRIPT
    assert plan["fields"] == [keys.JOB_FIELD, keys.TRACEPARENT_FIELD, keys.TRACESTATE_FIELD]


@pytest.mark.parametrize(
    ("over", "explicit"),
    [
        ({"tokenize": {"tokenizer": "tokenizer.json", "max_length": 128}}, False),
        ({}, True),
    ],
    ids=["text", "explicit-model-control"],
)
def test_models_the_router_must_place_get_no_plan(over: dict[str, Any], explicit: bool) -> None:
    cfg = tabular_config(**over)
    assert direct_plan(cfg, explicit_control=explicit) is None
    assert plan_parameter(cfg, explicit_control=explicit) == ""


def test_the_parameter_is_the_plan_as_json() -> None:
    cfg = tabular_config()
    assert json.loads(plan_parameter(cfg, explicit_control=False)) == direct_plan(cfg, False)


def test_a_text_model_gets_a_plan_with_the_tokenizer_the_door_runs() -> None:
    cfg = tabular_config(
        inputs=[{"name": "text", "datatype": "BYTES", "dims": [1]}],
        tokenize={"tokenizer": "tokenizer.json", "max_length": 128},
    )
    text = {"file": "/models/m/3/tokenizer.json", "max_length": 128}
    plan = direct_plan(cfg, explicit_control=False, text=text)
    assert plan is not None and plan["text"] == text
    assert direct_plan(cfg, explicit_control=True, text=text) is None
    # a model without text carries none, whatever it is handed
    plain = direct_plan(tabular_config(), explicit_control=False, text=text)
    assert plain is not None and plain["text"] is None


@pytest.mark.parametrize("model_bound", [0, 100])
def test_a_tiered_model_gets_a_placement_per_tier_where_the_router_would_place(
    model_bound: int,
) -> None:
    """Each tier's placement names the streams, keys and variant the router places a job
    on that tier by (policy.py tier_stream, model_streams); the door's tier choice itself is
    checked against the router's in tests/integration/test_door_placement.py."""
    cfg = tabular_config(
        tiers={"edge": {"max_cost": 64, "variant": "fp16"}, "center": {}, "mixed_variants": True},
        variants={"fp32": "model.onnx", "fp16": "model.fp16.onnx"},
        versions={"3": {"model.onnx": "0" * 64, "model.fp16.onnx": "1" * 64}},
        model_queue_bound=model_bound,
    )
    plan = direct_plan(cfg, explicit_control=False)
    assert plan is not None
    assert [(t["name"], t["max_cost"], t["variant"]) for t in plan["tiers"]] == [
        ("edge", 64, "fp16"),
        ("center", 0, cfg.default_variant),
    ]
    inputs = (TensorData("A", "FP32", (1, 20), b""), TensorData("B", "FP32", (1, 2, 3), b""))
    job = Job("r1", cfg.name, inputs, "gw:1", priority=3)
    for i, spec in enumerate(cfg.tiers):
        stream = tier_stream(cfg, job, spec)
        tier = plan["tiers"][i]
        assert _stream_of(plan, job, i) == stream.name
        assert tier["workers"] == keys.workers_key(stream.unit, spec.name)
        assert tier["rate"] == keys.rate_key(stream.unit, spec.name)
        assert tier["model_streams"] == [s.name for s in model_streams(cfg, stream)]
    assert plan["tiers"][0]["streams"] != plan["tiers"][1]["streams"]


def test_a_cascade_leaves_placement_to_the_router() -> None:
    cfg = tabular_config(tiers=TIERS, cascade={"output": "Y", "threshold": 0.9})
    assert direct_plan(cfg, explicit_control=False) is None
