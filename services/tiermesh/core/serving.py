"""What the mesh serves, decided from model control's state. Pure and synchronous.

The served set is every model of the repository folder minus the members of the unloaded
set in Redis (keys.UNLOADED_MODELS): "{model}" unloads every version of a model,
"{model}:{version}" one version. Every service reads that set (core/control_watch.py) and
asks these functions what it means for it: gateways and routers whether to accept a request
for (model, version), workers which compute units to open and which to close.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.model_config import ModelConfig


def member(model: str, version: str = "") -> str:
    """The set member standing for a model (every version) or one version of it."""
    return f"{model}:{version}" if version else model


def is_served(unloaded: Collection[str], model: str, version: str) -> bool:
    """Whether `version` of `model` is loaded (`version` resolved: never "")."""
    return model not in unloaded and member(model, version) not in unloaded


def worker_units(
    configs: Mapping[str, ModelConfig],
    names: Iterable[str],
    unloaded: Collection[str],
    generative: bool = False,
) -> dict[ComputeUnit, ModelConfig]:
    """The compute units a worker should have sessions for: every (version, variant) of the
    models it serves (`names`; empty: every model of the repository that is not a
    companion), less what is unloaded. Names the repository does not hold are skipped.
    Batched models only, or (`generative`) generative models only: each kind has its own
    loop (worker/loop.py, worker/generation.py)."""
    wanted = list(names) or sorted(n for n, c in configs.items() if not c.companion_of)
    out: dict[ComputeUnit, ModelConfig] = {}
    for name in wanted:
        cfg = configs.get(name)
        if cfg is None or cfg.companion_of or (cfg.generation is not None) != generative:
            continue
        for ver in cfg.versions:
            if not is_served(unloaded, cfg.name, ver.version):
                continue
            # A variant without a passing gate record gets no session (core/gates.py).
            for variant in cfg.servable_variants(ver.version):
                out[ComputeUnit(cfg.queue_model, ver.version, variant)] = cfg
    return out


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """What a worker does to match the served set. `open`: build sessions, join the groups,
    heartbeat. `reopen`: units still closing that are wanted again (their sessions are still
    there): heartbeat and read again. `close`: stop reading and heartbeating, finish what was
    read, then drop the session."""

    open: tuple[ComputeUnit, ...] = ()
    reopen: tuple[ComputeUnit, ...] = ()
    close: tuple[ComputeUnit, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.open or self.reopen or self.close)


def plan_units(
    wanted: Collection[ComputeUnit],
    serving: Collection[ComputeUnit],
    closing: Collection[ComputeUnit],
) -> UnitPlan:
    """From the units wanted and the worker's state (`serving`: open and read; `closing`:
    no longer read, finishing what was read) to what changes."""
    return UnitPlan(
        open=tuple(sorted(u for u in wanted if u not in serving and u not in closing)),
        reopen=tuple(sorted(u for u in wanted if u in closing)),
        close=tuple(sorted(u for u in serving if u not in wanted)),
    )
