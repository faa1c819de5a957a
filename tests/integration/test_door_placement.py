"""The Go front door's choice of tier and stream for a job (frontdoor/go/direct.go,
`frontdoor place`) against the router's (router/tiers.py choose_tier, router/policy.py
tier_stream) where every backlog meets its deadline: random shapes, priorities and live
tiers, every answer the same."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.go_toolchain import needs_go
from tests.integration.conftest import door_answers
from tests.unit.test_direct_plan import tabular_config
from tiermesh.core.direct_plan import direct_plan
from tiermesh.core.jobs import Job
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tensors import TensorData
from tiermesh.router.policy import job_cost, tier_stream
from tiermesh.router.tiers import TierState, choose_tier

pytestmark = [pytest.mark.slow, needs_go]


def jobs(rng: np.random.Generator, n: int, batched: bool) -> list[dict[str, Any]]:
    """Lines for `frontdoor place`: shapes short and long, one row or several, each with a
    random set of live tiers."""
    lines = []
    for _ in range(n):
        rows = int(rng.choice([1, 1, 2, 5])) if batched else 1
        lead = [rows] if batched else []
        a = [*lead, int(rng.integers(1, 300))]
        b = [*lead, int(rng.integers(1, 40)), int(rng.integers(1, 90))]
        alive = [bool(x) for x in rng.integers(0, 2, size=2)]
        lines.append({"priority": int(rng.integers(1, 4)), "shapes": [a, b], "alive": alive})
    return lines


def routers_choice(cfg: ModelConfig, line: dict[str, Any]) -> dict[str, str] | None:
    shapes = zip("AB", line["shapes"], strict=True)
    inputs = tuple(TensorData(name, "FP32", tuple(shape), b"") for name, shape in shapes)
    job = Job("r", cfg.name, inputs, "gw:1", priority=line["priority"])
    states = {t.name: TierState(alive) for t, alive in zip(cfg.tiers, line["alive"], strict=True)}
    tier = choose_tier(cfg.tiers, job_cost(cfg, job), None, states)
    if tier is None:
        return None
    return {"tier": tier.name, "stream": tier_stream(cfg, job, tier).name}


@pytest.mark.parametrize(
    ("tiers", "max_batch_size"),
    [
        ({"edge": {"max_cost": 64}, "center": {}}, 32),
        ({"edge": {"max_cost": 64}, "center": {}}, 0),
        ({"edge": {}, "center": {}}, 32),  # edge takes every cost
        ({"edge": {"max_cost": 1000}, "center": {}}, 8),
    ],
    ids=["edge-64", "not-batched", "edge-any", "edge-1000"],
)
def test_the_door_chooses_the_tier_and_stream_the_router_would(
    tiers: dict[str, Any], max_batch_size: int, door_binary: Path, tmp_path: Path
) -> None:
    cfg = tabular_config(tiers=tiers, max_batch_size=max_batch_size)
    plan = direct_plan(cfg, explicit_control=False)
    assert plan is not None and [t["name"] for t in plan["tiers"]] == ["edge", "center"]
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    rng = np.random.default_rng(len(json.dumps(tiers)) + max_batch_size)
    lines = jobs(rng, 400, max_batch_size > 0)
    answers = door_answers(door_binary, ["place", str(plan_file)], lines)
    for line, answer in zip(lines, answers, strict=True):
        assert answer == routers_choice(cfg, line), line
    # the script met every case: each tier chosen, and none where no tier lives
    chosen = {a["tier"] if a else None for a in answers}
    assert chosen == {"edge", "center", None}
    seen = {(tuple(line["alive"]), a is None) for line, a in zip(lines, answers, strict=True)}
    assert ((False, False), True) in seen
    assert all(not none for alive, none in seen if any(alive))
    assert len({a["stream"] for a in answers if a}) > 6  # levels and buckets of both tiers
