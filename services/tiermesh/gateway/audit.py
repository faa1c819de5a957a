"""The audit stream: who called what with which outcome, one entry per ModelInfer, model
control operation and batch-job call on an authenticated public port.

Entries hold the time, the operation (`infer`, `load`, `unload`, `batch.submit`, ...),
tenant ("-" when the caller was not identified), model, variant, outcome (gRPC code name),
request id, peer address and duration; never key material, tensors or text. `record` only
queues an entry; one writer task sends what is queued in a single pipeline, so auditing
adds no Redis round trip to a request. Entries whose write failed stay queued and go with
the next write; while the queue is full (`has_room` false: Redis away for long) the gateway
refuses audited calls (UNAVAILABLE) rather than serve them unrecorded. Only entries of calls
already under way when it filled can be lost, and those are logged and counted.
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
# Entries waiting for the writer: at this many the gateway refuses audited calls, and an
# entry beyond it is dropped (and counted): a Redis outage must not grow the gateway's
# memory without bound.
MAX_QUEUED = 10_000
# After a failed write the writer tries again this much later (not at every entry).
RETRY_S = 1.0
INFER = "infer"


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
    operation: str = INFER

    def fields(self) -> dict[str, str]:
        return {
            "time_ms": str(self.time_ms),
            "operation": self.operation,
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

    @property
    def has_room(self) -> bool:
        """Whether another audited call may start (its entry will have a place)."""
        return len(self._queued) < self._max_queued

    def record(self, entry: AuditEntry) -> None:
        """Called once as each audited call ends; never blocks, never raises."""
        if len(self._queued) >= self._max_queued:
            self._lose(1, "audit queue full")
            return
        self._queued.append(entry)
        self._wake.set()

    async def flush(self) -> bool:
        """Write every queued entry (XADD with approximate MAXLEN) in one pipeline; False
        when the write failed (the entries stay queued, first in line)."""
        batch = list(self._queued)
        self._queued.clear()
        if not batch:
            return True
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
            self._queued.extendleft(reversed(batch))
            if not self._failing:
                self._failing = True
                log.warning(
                    "audit write failed; entries are kept and audited calls refused once "
                    f"{self._max_queued} wait",
                    waiting=len(self._queued),
                    error=type(exc).__name__,
                )
            return False
        self.written += len(batch)
        if self._failing:
            self._failing = False
            log.info("audit writes succeed again")
        return True

    async def run(self, interval_s: float = RETRY_S) -> None:
        """The writer: flush whenever entries are queued, until cancelled; after a failed
        write, again `interval_s` later."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush():
                self._wake.set()
                await asyncio.sleep(interval_s)
            raise_if_cancelling()

    def _lose(self, n: int, why: str, **facts: str) -> None:
        self.lost += n
        self._on_lost(n)
        # Once per outage, not once per entry: the counter has the numbers.
        if not self._failing:
            self._failing = True
            log.warning(why + "; entries are being lost", lost=n, **facts)
