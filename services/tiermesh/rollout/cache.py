"""The router's copy of every model's rollout state, refreshed about once a second by one
pipelined read, so routing a request never waits on Redis for it."""

from __future__ import annotations

from collections.abc import Sequence

import structlog

from tiermesh.core.loops import repeat
from tiermesh.rollout.metrics import RolloutMetrics
from tiermesh.rollout.state import RolloutState
from tiermesh.rollout.store import RolloutStore

log = structlog.get_logger("tiermesh.rollout")


class RolloutStates:
    def __init__(
        self,
        store: RolloutStore,
        models: Sequence[str],
        metrics: RolloutMetrics | None = None,
    ) -> None:
        self._store = store
        self._models = list(models)
        self._metrics = metrics
        self._states: dict[str, RolloutState] = {}

    def get(self, model: str) -> RolloutState | None:
        return self._states.get(model)

    def put(self, state: RolloutState) -> None:
        """A change this process made itself: in force here at once, not a second later."""
        self._states[state.model] = state
        self._export(state)

    async def refresh(self) -> None:
        """Read every model's state; raises Redis errors (the last known states stay)."""
        states = await self._store.states(self._models)
        self._states = states
        for state in states.values():
            self._export(state)

    async def run(self, interval_s: float) -> None:
        """Refresh until cancelled. While Redis is away the last known states stay in force
        (requests fail at admission anyway)."""
        await repeat(
            self.refresh,
            lambda: interval_s,
            lambda exc: log.debug("rollout states not refreshed", error=repr(exc)),
        )

    def _export(self, state: RolloutState) -> None:
        if self._metrics is not None:
            share = state.percent if state.running else 0.0
            self._metrics.canary_percent.labels(state.model).set(share)
