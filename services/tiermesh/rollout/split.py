"""Which version serves a request: pure, from the rollout state the router has cached.

A request that names a version gets it. Otherwise, during a running rollout, a sticky hash
of the request's key decides: under the canary percent -> canary, else stable. The key is
the `sticky_key` request parameter, else the tenant, else the client's request id, else the
gateway's (random) request id: one caller or tenant sees one version, not a mix. The hash
is salted with the model and canary version, so the same callers are not the canary's
guinea pigs in every rollout. A configurable share of stable-routed requests is also
mirrored to the canary (by a hash of the request id) to measure output drift.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from tiermesh.core.jobs import Job
from tiermesh.rollout.state import RolloutState

Arm = Literal["named", "default", "stable", "canary"]


@dataclass(frozen=True, slots=True)
class Placement:
    version: str
    arm: Arm
    # Set when a copy of the request should also run on this (canary) version.
    shadow_version: str = ""


def unit_interval(text: str) -> float:
    """A uniform-looking number in [0, 1) that depends only on `text`."""
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def sticky_key(job: Job) -> str:
    return (
        job.controls.sticky_key
        or job.tenant
        or job.client_request_id
        or job.request_id  # random: such a caller is not sticky
    )


def in_canary(model: str, canary: str, key: str, percent: float) -> bool:
    return unit_interval(f"{model}\x00{canary}\x00{key}") * 100 < percent


def mirrored(request_id: str, fraction: float) -> bool:
    return unit_interval(f"mirror\x00{request_id}") < fraction


def place(default_version: str, state: RolloutState | None, job: Job) -> Placement:
    """The version `job` runs on. `default_version` is the config's, used when there is no
    rollout state at all."""
    if job.version:
        return Placement(job.version, "named")
    if state is None or state.state == "none":
        return Placement(default_version, "default")
    if not state.running:
        return Placement(state.stable, "stable")
    if in_canary(state.model, state.canary, sticky_key(job), state.percent):
        return Placement(state.canary, "canary")
    shadow = mirrored(job.request_id, state.thresholds.mirror_fraction)
    return Placement(state.stable, "stable", state.canary if shadow else "")
