"""The tier policy: thresholds, spill-over both ways, dead tiers avoided, deadlines."""

from __future__ import annotations

import pytest

from tiermesh.core.tier_spec import TierSpec
from tiermesh.router.tiers import TierState, choose_tier, preferred

EDGE = TierSpec("edge", "fp32", max_cost=64)
CENTER = TierSpec("center", "fp32")
TIERS = (EDGE, CENTER)
UP = TierState(alive=True)
DOWN = TierState(alive=False)


def pick(cost: int, edge: TierState, center: TierState, ms_left: float | None = None) -> str | None:
    tier = choose_tier(TIERS, cost, ms_left, {"edge": edge, "center": center})
    return tier.name if tier else None


@pytest.mark.parametrize(
    ("cost", "tier"), [(1, "edge"), (64, "edge"), (65, "center"), (10_000, "center")]
)
def test_thresholds(cost: int, tier: str) -> None:
    assert preferred(TIERS, cost).name == tier
    assert pick(cost, UP, UP) == tier


def test_no_limit_on_the_lightest_tier_takes_everything() -> None:
    assert preferred((TierSpec("edge", "fp32"), CENTER), 10**6).name == "edge"


def test_a_dead_tier_is_avoided() -> None:
    assert pick(10, DOWN, UP) == "center"  # light, edge down
    assert pick(500, UP, DOWN) == "edge"  # heavy, center down: edge rather than nothing
    assert pick(10, DOWN, DOWN) is None
    assert pick(10, UP, TierState(alive=False, backlog=0)) == "edge"


def test_light_work_spills_to_center_when_edge_would_miss_its_deadline() -> None:
    slow_edge = TierState(alive=True, backlog=100, rate=50.0)  # 2 s to drain
    assert pick(10, slow_edge, UP, ms_left=500) == "center"
    assert pick(10, slow_edge, UP, ms_left=5_000) == "edge"  # room enough: stay near
    assert pick(10, slow_edge, UP, ms_left=None) == "edge"  # no deadline: no spill


def test_light_work_goes_to_edge_when_center_is_saturated() -> None:
    tiers = (TierSpec("edge", "fp32", max_cost=64), TierSpec("center", "fp32"))
    saturated = TierState(alive=True, backlog=1_000, rate=100.0)  # 10 s
    # A mid-cost request preferring center (edge limit 8 here) spills back to edge.
    small_edge = (TierSpec("edge", "fp32", max_cost=8), tiers[1])
    got = choose_tier(small_edge, 4, 1_000, {"edge": UP, "center": saturated})
    assert got is not None and got.name == "edge"


def test_heavy_work_stays_in_center_even_when_it_will_be_late() -> None:
    saturated = TierState(alive=True, backlog=1_000, rate=100.0)
    assert pick(500, UP, saturated, ms_left=100) == "center"


def test_nothing_meets_the_deadline_the_preferred_live_tier_takes_it() -> None:
    late = TierState(alive=True, backlog=1_000, rate=10.0)
    assert pick(10, late, late, ms_left=50) == "edge"


def test_unmeasured_rate_is_no_reason_to_spill() -> None:
    assert pick(10, TierState(alive=True, backlog=500, rate=0.0), UP, ms_left=1) == "edge"


def test_no_tiers_configured() -> None:
    assert choose_tier((), 1, None, {}) is None
