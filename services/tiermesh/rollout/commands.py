"""What `tiermesh rollout start|promote|rollback|status` do, against Redis and the model
repository's config. The CLI only parses arguments and prints."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tiermesh.core.model_config import ModelConfig
from tiermesh.rollout import state as transitions
from tiermesh.rollout.changes import Change, change_of
from tiermesh.rollout.judge import RolloutVerdict, judge
from tiermesh.rollout.state import RolloutError, RolloutState
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import WindowStats, window_seconds


@dataclass(frozen=True, slots=True)
class Status:
    state: RolloutState | None
    stable: str  # the version unrouted requests get outside a running rollout
    window: dict[str, WindowStats]  # by version
    verdict: RolloutVerdict | None  # what the controller would decide now (running only)
    changes: list[Change]


class Rollouts:
    def __init__(
        self,
        store: RolloutStore,
        configs: dict[str, ModelConfig],
        who: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._configs = configs
        self._who = who
        self._clock = clock

    def _config(self, model: str) -> ModelConfig:
        cfg = self._configs.get(model)
        if cfg is None or cfg.companion_of:
            raise RolloutError(f"unknown model {model!r} (companions follow their model)")
        return cfg

    async def start(self, model: str, canary: str, percent: float) -> RolloutState:
        cfg = self._config(model)
        current = await self._store.state(model)
        new = transitions.start(cfg, current, canary, percent, self._now_ms())
        return await self._write(cfg, current, new, "start")

    async def promote(self, model: str) -> RolloutState:
        cfg = self._config(model)
        current = await self._store.state(model)
        new = transitions.promote(current, self._now_ms())
        return await self._write(cfg, current, new, "promote")

    async def rollback(self, model: str) -> RolloutState:
        cfg = self._config(model)
        current = await self._store.state(model)
        new = transitions.roll_back(current, self._now_ms())
        return await self._write(cfg, current, new, "rollback", reason="manual")

    async def status(self, model: str, events: int = 5) -> Status:
        cfg = self._config(model)
        current = await self._store.state(model)
        stable = transitions.effective_stable(cfg, current)
        spec = current.thresholds if current else cfg.canary
        since = current.started_ms if current and current.running else 0
        seconds = window_seconds(self._clock(), spec.window_s, since)
        versions = [stable, *([current.canary] if current and current.canary else [])]
        window = {v: await self._store.window(model, v, seconds) for v in dict.fromkeys(versions)}
        verdict = None
        if current is not None and current.running:
            verdict = judge(window[current.stable], window[current.canary], spec)
        return Status(current, stable, window, verdict, await self._store.changes(model, events))

    async def _write(
        self,
        cfg: ModelConfig,
        current: RolloutState | None,
        new: RolloutState,
        action: str,
        reason: str = "",
    ) -> RolloutState:
        change = change_of(cfg, new, action, self._who, reason=reason)
        if await self._store.replace(current.rev if current else 0, new, change) is None:
            raise RolloutError(f"the rollout of {cfg.name} changed meanwhile; look and retry")
        return new

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
