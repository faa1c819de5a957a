"""The audit stream: who called what with which outcome, one entry per ModelInfer on an
authenticated public port.

Entries hold the time, tenant ("-" when the caller was not identified), model, variant,
outcome (gRPC code name), request id, peer address and duration; never key material,
tensors or text. `record` only queues an entry; one writer task sends what is queued in a
single pipeline, so auditing adds no Redis round trip to a request and Redis trouble can
never fail or slow one: lost entries are logged and counted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from tiermesh.core import keys
from tiermesh.core.loops import raise_if_cancelling

log = structlog.get_logger("tiermesh.gateway")

NO_TENANT = "-"
# Entries waiting for the writer beyond this are dropped (and counted): a Redis outage must
# not grow the gateway's memory without bound.
MAX_QUEUED = 10_000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    time_ms: int
    tenant: str
    model: str
    variant: str
    outcome: str
    request_id: str
    peer: str
    duration_ms: float

    def fields(self) -> dict[str, str]:
        return {
            "time_ms": str(self.time_ms),
            "tenant": self.tenant or NO_TENANT,
            "model": self.model,
            "variant": self.variant,
            "outcome": self.outcome,
            "request_id": self.request_id,
            "peer": self.peer,
            "duration_ms": f"{self.duration_ms:.3f}",
        }


class AuditLog:
    """One per gateway. `run` is the writer task (owned and cancelled by __main__), `flush`
    sends what is queued now (also called once more at shutdown)."""

    def __init__(
        self,
        redis: aioredis.Redis,
        max_len: int,
        on_lost: Callable[[int], None] = lambda n: None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self._redis = redis
        self._max_len = max_len
        self._on_lost = on_lost
        self._max_queued = max_queued
        self._queued: deque[AuditEntry] = deque()
        self._wake = asyncio.Event()
        self._failing = False
        self.written = 0
        self.lost = 0

    def record(self, entry: AuditEntry) -> None:
        """Called once as each audited call ends; never blocks, never raises."""
        if len(self._queued) >= self._max_queued:
            self._lose(1, "audit queue full")
            return
        self._queued.append(entry)
        self._wake.set()

    async def flush(self) -> None:
        """Write every queued entry (XADD with approximate MAXLEN) in one pipeline."""
        batch = list(self._queued)
        self._queued.clear()
        if not batch:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for entry in batch:
                    pipe.xadd(
                        keys.AUDIT_STREAM,
                        entry.fields(),  # type: ignore[arg-type]
                        maxlen=self._max_len,
                        approximate=True,
                    )
                await pipe.execute()
        except (RedisError, OSError) as exc:
            self._lose(len(batch), "audit write failed", error=type(exc).__name__)
            return
        self.written += len(batch)
        if self._failing:
            self._failing = False
            log.info("audit writes succeed again")

    async def run(self) -> None:
        """The writer: flush whenever entries are queued, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.flush()
            raise_if_cancelling()

    def _lose(self, n: int, why: str, **facts: str) -> None:
        self.lost += n
        self._on_lost(n)
        # Once per outage, not once per entry: the counter has the numbers.
        if not self._failing:
            self._failing = True
            log.warning(why + "; entries are being lost", lost=n, **facts)
