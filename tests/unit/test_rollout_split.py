"""Which version serves a request: sticky split, mirroring, named versions."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tiermesh.core.canary_spec import CanarySpec
from tiermesh.core.controls import Controls
from tiermesh.core.jobs import Job
from tiermesh.rollout.split import in_canary, mirrored, place, sticky_key
from tiermesh.rollout.state import RolloutState

RUNNING = RolloutState(
    model="m", stable="1", canary="2", percent=20.0, state="running", rev=1,
    thresholds=CanarySpec(mirror_fraction=0.0),
)  # fmt: skip


def _job(**fields: Any) -> Job:
    return dataclasses.replace(Job(request_id="r", model="m", inputs=(), gateway="g"), **fields)


@pytest.mark.parametrize("percent", [1.0, 10.0, 20.0, 50.0, 90.0])
def test_share_of_keys_on_the_canary_matches_the_percent(percent: float) -> None:
    keys = [f"tenant-{i}" for i in range(20_000)]
    share = sum(in_canary("m", "2", k, percent) for k in keys) / len(keys) * 100
    assert abs(share - percent) < 1.0  # 20k keys: sd of the share is <= 0.36 points


def test_the_same_key_always_gets_the_same_version() -> None:
    for i in range(200):
        job = _job(controls=Controls(sticky_key=f"user-{i}"))
        first = place("1", RUNNING, job).version
        again = [place("1", RUNNING, _job(request_id=str(n), controls=job.controls))
                 for n in range(5)]  # fmt: skip
        assert {p.version for p in again} == {first}


def test_a_bigger_percent_keeps_the_keys_already_on_the_canary() -> None:
    keys = [f"k{i}" for i in range(2000)]
    at10 = {k for k in keys if in_canary("m", "2", k, 10)}
    at30 = {k for k in keys if in_canary("m", "2", k, 30)}
    assert at10 <= at30


def test_sticky_key_prefers_parameter_then_tenant_then_client_id_then_request_id() -> None:
    assert (
        sticky_key(_job(controls=Controls(sticky_key="s"), tenant="t", client_request_id="c"))
        == "s"
    )
    assert sticky_key(_job(tenant="t", client_request_id="c")) == "t"
    assert sticky_key(_job(client_request_id="c")) == "c"
    assert sticky_key(_job()) == "r"


def test_a_named_version_is_served_whatever_the_rollout() -> None:
    placed = place("1", dataclasses.replace(RUNNING, percent=100.0), _job(version="1"))
    assert (placed.version, placed.arm, placed.shadow_version) == ("1", "named", "")


def test_without_a_rollout_the_default_version_serves() -> None:
    assert place("4", None, _job()).version == "4"


@pytest.mark.parametrize("state", ["rolled_back", "promoted"])
def test_after_a_rollout_its_stable_version_serves(state: str) -> None:
    done = dataclasses.replace(RUNNING, state=state, stable="2", percent=0.0)
    assert place("1", done, _job()).version == "2"


def test_zero_and_hundred_percent() -> None:
    jobs = [_job(tenant=f"t{i}") for i in range(500)]
    assert {place("1", dataclasses.replace(RUNNING, percent=0.0), j).version for j in jobs} == {"1"}
    assert {place("1", dataclasses.replace(RUNNING, percent=100.0), j).version for j in jobs} == {
        "2"
    }


def test_a_share_of_stable_routed_requests_is_mirrored_to_the_canary() -> None:
    mirroring = dataclasses.replace(
        RUNNING, percent=0.0, thresholds=CanarySpec(mirror_fraction=0.25)
    )
    placed = [place("1", mirroring, _job(request_id=f"r{i}")) for i in range(4000)]
    shadows = [p for p in placed if p.shadow_version]
    assert {p.version for p in placed} == {"1"}
    assert {p.shadow_version for p in shadows} == {"2"}
    assert abs(len(shadows) / len(placed) - 0.25) < 0.03
    assert mirrored("r1", 1.0) and not mirrored("r1", 0.0)
