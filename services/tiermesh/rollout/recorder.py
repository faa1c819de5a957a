"""The gateway's side of rollouts: where the final answer of a request is known, its
outcome and latency are counted per (model, version), and the stable and canary answers
of mirrored requests are paired for output drift. Counts go to Redis in one pipelined
flush every few hundred ms (store.flush), never one call per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping

import grpc
import redis.asyncio as aioredis
import structlog

from tiermesh.core.jobs import JobResult
from tiermesh.core.loops import raise_if_cancelling
from tiermesh.rollout.drift import Pair, ShadowPairs
from tiermesh.rollout.store import RolloutStore
from tiermesh.rollout.window import WindowCounts

log = structlog.get_logger("tiermesh.rollout")
# Unflushed counts beyond this many buckets are dropped while Redis is away.
MAX_PENDING_BUCKETS = 10_000


def is_shadow(result: JobResult) -> bool:
    return bool(result.controls.shadow_of)


class OutcomeRecorder:
    """`models` maps each public model name to the model whose versions it runs (a
    companion's answers count for its model, whose rollout it shares)."""

    def __init__(
        self,
        store: RolloutStore,
        models: Mapping[str, str],
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._models = models
        self._store = store
        self._clock_ns = clock_ns
        self._counts = WindowCounts()
        self._pairs = ShadowPairs()
        self.lost_flushes = 0

    def answered(
        self,
        model: str,
        version: str,
        code: grpc.StatusCode,
        received_ns: int,
        ended_ns: int = 0,
    ) -> None:
        """A request routed to `version` got its final answer (or ran out of time), at
        `ended_ns` (0: now)."""
        now = ended_ns or self._clock_ns()
        latency_ms = (now - received_ns) / 1e6 if received_ns else None
        model = self._models.get(model, model)
        self._counts.outcome(model, version, now // 10**9, code.name, latency_ms)

    def mirrored(self, shadow_id: str, model: str, deadline_ns: int) -> None:
        """The router also sent a copy of a request to the canary as `shadow_id`."""
        model = self._models.get(model, model)
        self._pairs.expect(shadow_id, model, deadline_ns, self._clock_ns())

    def primary(self, shadow_id: str, result: JobResult) -> None:
        """The stable answer of a mirrored request."""
        if result.code != grpc.StatusCode.OK:
            self._pairs.forget(shadow_id)
            return
        self._pair(self._pairs.primary(shadow_id, result.outputs))

    def shadow(self, result: JobResult) -> None:
        """The canary's answer to a mirrored copy: it counts as a canary answer, and its
        outputs are compared with the stable ones. Nobody waits for it."""
        self.answered(result.model, result.version, result.code, result.timing.received_ns)
        if result.code != grpc.StatusCode.OK:
            self._pairs.forget(result.request_id)
            return
        self._pair(self._pairs.shadow(result.request_id, result.version, result.outputs))

    def _pair(self, pair: Pair | None) -> None:
        if pair is not None:
            second = self._clock_ns() // 10**9
            self._counts.cosine(pair.model, pair.canary_version, second, pair.similarity)

    async def flush(self) -> None:
        """Everything counted so far into Redis; kept for the next try when Redis fails."""
        if not self._counts:
            return
        ints, floats = self._counts.drain()
        try:
            await self._store.flush(ints, floats)
        except (aioredis.RedisError, OSError) as exc:
            self.lost_flushes += 1
            log.debug("rollout counts not flushed yet", error=repr(exc))
            if len(ints) + len(self._counts.ints) <= MAX_PENDING_BUCKETS:
                self._counts.merge(ints, floats)

    async def run(self, interval_s: float) -> None:
        """Flush every `interval_s` until cancelled (the owner flushes once more after)."""
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()
            raise_if_cancelling()
