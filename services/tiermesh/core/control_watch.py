"""Every service's view of model control: the unloaded set in Redis, and the repository
folder re-read when it changed.

Why a polled generation counter rather than pub/sub or keyspace notifications: every load
and unload increments keys.CONTROL_GENERATION in the transaction that changes the set, and
each service GETs it every `model_control_refresh_ms` (500 ms by default): one round trip of
a few bytes, ~2 per second per process, nothing per request. Pub/sub would be faster to
notice but loses messages across a reconnect or a Redis restart, so a poll would be needed
as a fallback anyway; keyspace notifications need a server setting. The counter alone is
always right: a service that missed any number of changes sees a different value and reads
the whole state again (a Redis that lost the key reads as a change too).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog
from redis import exceptions as redis_errors

from tiermesh.core import keys
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.serving import is_served

log = structlog.get_logger("tiermesh.control")


@dataclass(frozen=True, slots=True)
class ControlState:
    """The unloaded set at one generation ("" before any load or unload)."""

    generation: str = ""
    unloaded: frozenset[str] = frozenset()

    def served(self, cfg: ModelConfig, version: str) -> bool:
        """Whether (model, resolved version) is loaded; a companion (another interface
        onto a model's sessions) only while its model is loaded too."""
        return is_served(self.unloaded, cfg.name, version) and is_served(
            self.unloaded, cfg.queue_model, version
        )


class ControlWatch:
    """Reads the control state; re-reads `repo` from disk when the generation changed.
    One per service, built in its __main__; its `run` task is owned there (or by the loop
    that passes `on_change`)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        repo: ModelRepository,
        on_change: Callable[[ControlState], Awaitable[None]] | None = None,
    ) -> None:
        self._redis = redis
        self._repo = repo
        # Awaited with every new state `changed` reads (the repository re-read before).
        self.on_change = on_change
        self.state = ControlState()
        self._seen: str | None = None
        # One look at a time: requests catching up at once wait for the first one's.
        self._looking = asyncio.Lock()

    async def read(self) -> ControlState:
        """The state as Redis holds it now (without touching the repository)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(keys.CONTROL_GENERATION)
            pipe.smembers(keys.UNLOADED_MODELS)
            generation, members = await pipe.execute()
        self.state = ControlState(_text(generation), frozenset(_text(m) for m in members))
        self._seen = self.state.generation
        return self.state

    async def changed(self) -> ControlState | None:
        """The new state when the generation moved since the last read (the repository
        re-read first, so a model added to the folder is known), else None. Raises
        Redis errors; a repository that no longer parses keeps the configs read before."""
        async with self._looking:
            return await self._look()

    async def _look(self) -> ControlState | None:
        generation = _text(await self._redis.get(keys.CONTROL_GENERATION))
        if generation == self._seen:
            return None
        await self.reload_repository()
        state = await self.read()
        if self.on_change is not None:
            try:
                await self.on_change(state)
            except BaseException:
                self._seen = None  # applied again at the next look
                raise
        return state

    async def catch_up(self) -> None:
        """Read the state now if it changed, for a request this service would refuse
        (unknown model, or not loaded) that another service may already have loaded: one
        GET, only on that path. A Redis error leaves the last view in force."""
        try:
            await self.changed()
        except (redis_errors.RedisError, OSError):
            pass

    async def reload_repository(self) -> None:
        try:
            await asyncio.to_thread(self._repo.load)
        except (RepositoryError, OSError) as exc:
            log.error(
                "model repository not re-read; keeping the models read before", problem=str(exc)
            )

    async def run(
        self,
        interval_s: float,
        on_change: Callable[[ControlState], Awaitable[None]] | None = None,
    ) -> None:
        """Poll until cancelled; `on_change` (if given, else the one set at construction)
        is awaited with every new state."""
        if on_change is not None:
            self.on_change = on_change
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.changed()
            except (redis_errors.RedisError, OSError) as exc:
                # The last view stays in force until Redis answers again.
                log.warning("model control state not applied yet", error=repr(exc))
            raise_if_cancelling()


def _text(value: object) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
