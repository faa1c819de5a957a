"""A model's rollout state and its transitions, as plain values.

Lifecycle: none -> running (`start`) -> promoted (`promote`: the canary becomes stable) or
rolled_back (`rollback`, by command or by the controller on a breach). A new `start` may
follow either end state. Each transition bumps `rev`; a write only lands when the stored
rev is still the one the transition started from (store.py), so a command and the
controller racing cannot both win.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from tiermesh.core.canary_spec import CanarySpec
from tiermesh.core.model_config import ModelConfig

Phase = Literal["none", "running", "rolled_back", "promoted"]
PHASES = ("none", "running", "rolled_back", "promoted")


class RolloutError(Exception):
    """A rollout command that cannot apply to the model's current state or config."""


@dataclass(frozen=True, slots=True)
class RolloutState:
    model: str
    stable: str
    canary: str = ""
    percent: float = 0.0
    state: Phase = "none"
    started_ms: int = 0
    updated_ms: int = 0
    rev: int = 0
    # Thresholds in force, copied from the config's `canary:` section when it started.
    thresholds: CanarySpec = field(default_factory=CanarySpec)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def to_fields(self) -> dict[str, str]:
        """The Redis hash of this state (core/keys.rollout_key)."""
        out = {
            "model": self.model,
            "stable": self.stable,
            "canary": self.canary,
            "percent": repr(self.percent),
            "state": self.state,
            "started_ms": str(self.started_ms),
            "updated_ms": str(self.updated_ms),
            "rev": str(self.rev),
        }
        out.update({f"t.{k}": v for k, v in self.thresholds.as_strings().items()})
        return out

    @classmethod
    def from_fields(cls, raw: dict[str, str]) -> RolloutState:
        state = raw.get("state", "none")
        return cls(
            model=raw["model"],
            stable=raw["stable"],
            canary=raw.get("canary", ""),
            percent=float(raw.get("percent", "0")),
            state=state if state in PHASES else "none",  # type: ignore[arg-type]
            started_ms=int(raw.get("started_ms", "0")),
            updated_ms=int(raw.get("updated_ms", "0")),
            rev=int(raw.get("rev", "0")),
            thresholds=CanarySpec.from_strings(
                {k[2:]: v for k, v in raw.items() if k.startswith("t.")}
            ),
        )


def effective_stable(cfg: ModelConfig, current: RolloutState | None) -> str:
    """The version unrouted requests get outside a running rollout: the rollout's stable
    one once there was a rollout (a promotion outlives the config), else the config's."""
    if current is not None and current.state != "none" and cfg.version(current.stable):
        return current.stable
    return cfg.version_for("")


def start(
    cfg: ModelConfig, current: RolloutState | None, canary: str, percent: float, now_ms: int
) -> RolloutState:
    if current is not None and current.running:
        raise RolloutError(
            f"a rollout of {cfg.name} to version {current.canary} is running; "
            "promote or roll it back first"
        )
    if cfg.version(canary) is None or not canary:
        known = ", ".join(v.version for v in cfg.versions)
        raise RolloutError(f"model {cfg.name} has no version {canary!r} (versions: {known})")
    stable = effective_stable(cfg, current)
    if canary == stable:
        raise RolloutError(f"version {canary} of {cfg.name} is already the stable one")
    if not 0 <= percent <= 100:
        raise RolloutError(f"percent must be in 0..100, got {percent}")
    return RolloutState(
        model=cfg.name,
        stable=stable,
        canary=canary,
        percent=float(percent),
        state="running",
        started_ms=now_ms,
        updated_ms=now_ms,
        rev=(current.rev if current else 0) + 1,
        thresholds=cfg.canary,
    )


def promote(current: RolloutState | None, now_ms: int) -> RolloutState:
    """The canary becomes the stable version and takes all traffic."""
    running = _running(current, "promote")
    return dataclasses.replace(
        running,
        stable=running.canary,
        percent=100.0,
        state="promoted",
        updated_ms=now_ms,
        rev=running.rev + 1,
    )


def roll_back(current: RolloutState | None, now_ms: int) -> RolloutState:
    """No more traffic to the canary; the stable version takes everything again."""
    running = _running(current, "roll back")
    return dataclasses.replace(
        running, percent=0.0, state="rolled_back", updated_ms=now_ms, rev=running.rev + 1
    )


def _running(current: RolloutState | None, what: str) -> RolloutState:
    if current is None or not current.running:
        state = current.state if current else "none"
        raise RolloutError(f"nothing to {what}: no rollout is running (state {state})")
    return current
