"""How a worker opens a compute unit's session, and what it needs to follow model control.

The decisions (which units to open and close) are core/serving.py's; the loop that applies
them is worker/loop.py's `Worker.apply`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.keys import split_unit
from tiermesh.core.repository import ModelConfig, ModelRepository
from tiermesh.worker.runner import ComputeTime, ModelRunner


def open_runner(
    repo: ModelRepository,
    unit: str,
    cfg: ModelConfig,
    threads: int,
    compute_time: ComputeTime | None = None,
) -> ModelRunner:
    """The session of one compute unit, built from bytes that matched their sha256
    (`verified_model`: nothing changed on disk afterwards reaches it). Blocking: reads,
    hashes and builds; the loop calls it in a thread. Raises RepositoryError on a mismatch."""
    _, version, variant = split_unit(unit)
    return ModelRunner(
        cfg,
        repo.verified_model(cfg.name, version, variant),
        threads,
        preoptimized=repo.preoptimized(cfg.name, variant, version),
        compute_time=compute_time,
    )


@dataclass(frozen=True)
class UnitControl:
    """What a worker follows model control with: the watch over the state in Redis (which
    re-reads `repo` when it changed), the models it serves (empty: every model), and how
    to open a unit. Built in the worker's __main__."""

    watch: ControlWatch
    repo: ModelRepository
    names: Sequence[str]
    open: Callable[[str, ModelConfig], ModelRunner]
    interval_s: float = 0.5
