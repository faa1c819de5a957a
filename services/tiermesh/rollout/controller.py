"""The rollout controller: runs in every router, evaluates in one of them at a time (the
holder of a Redis lock with a TTL; another router takes over within the TTL when it dies),
every ~0.5 s: each running canary's window against its stable version's, and on a breach
an automatic rollback (canary share 0, state rolled_back), logged, counted and recorded in
the change log."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry

from tiermesh.core.loops import lock_owner, raise_if_cancelling
from tiermesh.core.model_config import ModelConfig
from tiermesh.rollout import state as transitions
from tiermesh.rollout.cache import RolloutStates
from tiermesh.rollout.changes import change_of
from tiermesh.rollout.judge import RolloutVerdict, judge
from tiermesh.rollout.metrics import RolloutMetrics
from tiermesh.rollout.state import RolloutState
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import window_seconds

log = structlog.get_logger("tiermesh.rollout")
WHO = "controller"


@dataclass(frozen=True, slots=True)
class Evaluation:
    model: str
    canary: str
    verdict: RolloutVerdict
    rolled_back: bool = False


class RolloutController:
    def __init__(
        self,
        store: RolloutStore,
        configs: Mapping[str, ModelConfig],
        owner: str,
        metrics: RolloutMetrics | None = None,
        states: RolloutStates | None = None,
        clock: Callable[[], float] = time.time,
        lock_ttl_ms: int = 3000,
    ) -> None:
        self._store = store
        self._configs = {n: c for n, c in configs.items() if not c.companion_of}
        self._owner = owner
        self._metrics = metrics
        self._states = states
        self._clock = clock
        self._lock_ttl_ms = lock_ttl_ms
        self.rollbacks = 0

    async def run(self, interval_s: float) -> None:
        """Evaluate every `interval_s` until cancelled; Redis trouble skips a round."""
        while True:
            try:
                await self.evaluate_once()
            except (aioredis.RedisError, OSError) as exc:
                log.warning("rollout evaluation skipped", error=repr(exc))
            raise_if_cancelling()
            await asyncio.sleep(interval_s)

    async def evaluate_once(self) -> list[Evaluation]:
        """One round, if this router holds the lock (else nothing): every running canary
        judged, breaches rolled back."""
        if not await self._store.hold_lock(self._owner, self._lock_ttl_ms):
            return []
        states = await self._store.states(list(self._configs))
        return [await self._evaluate(s) for s in states.values() if s.running]

    async def _evaluate(self, state: RolloutState) -> Evaluation:
        spec = state.thresholds
        # Nothing from before the rollout started counts (an earlier try of this canary).
        seconds = window_seconds(self._clock(), spec.window_s, state.started_ms)
        stable = await self._store.window(state.model, state.stable, seconds)
        canary = await self._store.window(state.model, state.canary, seconds)
        verdict = judge(stable, canary, spec)
        if verdict.action != "rollback":
            return Evaluation(state.model, state.canary, verdict)
        new = transitions.roll_back(state, int(self._clock() * 1000))
        change = change_of(
            self._configs[state.model],
            new,
            "auto-rollback",
            WHO,
            reason=verdict.reason,
            detail=verdict.detail,
        )
        entry = await self._store.replace(state.rev, new, change)
        if entry is None:  # a command changed the rollout meanwhile: it wins
            return Evaluation(state.model, state.canary, verdict)
        self.rollbacks += 1
        if self._states is not None:
            self._states.put(new)
        if self._metrics is not None:
            self._metrics.rollbacks.labels(state.model, verdict.reason).inc()
            self._metrics.canary_percent.labels(state.model).set(0)
        log.warning(
            "canary rolled back",
            model=state.model,
            canary=state.canary,
            stable=state.stable,
            reason=verdict.reason,
            detail=verdict.detail,
            change=entry,
        )
        return Evaluation(state.model, state.canary, verdict, rolled_back=True)


def router_rollouts(
    redis: aioredis.Redis,
    configs: Mapping[str, ModelConfig],
    registry: CollectorRegistry,
    lock_ttl_ms: int,
) -> tuple[RolloutStates, RolloutController]:
    """A router's rollouts: the states it routes by (refreshed by a periodic task of their
    own) and the controller that evaluates them, in one of the routers at a time."""
    store = RolloutStore(redis)
    metrics = RolloutMetrics(registry)
    states = RolloutStates(
        store, sorted(n for n, c in configs.items() if not c.companion_of), metrics
    )
    controller = RolloutController(
        store, configs, lock_owner(), metrics, states, lock_ttl_ms=lock_ttl_ms
    )
    return states, controller
