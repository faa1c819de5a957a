"""The worker's heartbeat and reclaim loops end when cancelled, even when the cancellation
lands in a Redis call that turns it into a TimeoutError (an OSError, so one of
STREAM_ERRORS: caught and logged as a failed round). A worker whose reclaimer swallowed its
cancel never finished `run` (tests/integration/test_worker.py, once in a full suite)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tiermesh.worker.membership import Membership
from tiermesh.worker.served import ServedUnits


class CancelIntoTimeout:
    """A stream client whose calls hang until cancelled, then raise TimeoutError, as
    redis-py's read timeout can when a cancel meets it."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.converting = True  # False: a cancel goes through (the test's cleanup)

    async def _hang(self) -> Any:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.converting:
                raise
            raise TimeoutError("Timeout reading from socket") from None

    async def heartbeat(
        self, units: list[str], tier: str, ttl_ms: int, providers: Any = None
    ) -> None:
        await self._hang()

    async def reclaim_many(self, rooms: dict[Any, int], min_idle_ms: int) -> Any:
        return await self._hang()


def _membership(streams: CancelIntoTimeout) -> Membership:
    units = ServedUnits("edge", {}, {}, online=True, background=False)
    return Membership(
        streams=streams,  # type: ignore[arg-type]
        units=units,
        intake=None,  # type: ignore[arg-type]  # not reached: no unit has a stream
        handoff=None,  # type: ignore[arg-type]
        background=None,
        stopping=asyncio.Event(),
        heartbeat_interval_ms=1,
        heartbeat_ttl_ms=1000,
        reclaim_interval_ms=1,
        reclaim_min_idle_ms=1,
        max_deliveries=3,
    )


@pytest.mark.parametrize("loop", ["heartbeats", "reclaimer"])
async def test_a_cancel_turned_into_a_stream_error_ends_the_loop(loop: str) -> None:
    streams = CancelIntoTimeout()
    task = asyncio.create_task(getattr(_membership(streams), loop)())
    await asyncio.wait_for(streams.entered.wait(), 5)
    task.cancel()
    # Without the check after each round the loop logs the TimeoutError, sleeps, and runs
    # on (every later cancel lands in the hanging call too): it is not done in 5 s.
    done, _ = await asyncio.wait({task}, timeout=5)
    try:
        assert task in done
        assert task.cancelled()
    finally:
        streams.converting = False
        task.cancel()
        await asyncio.wait({task}, timeout=5)
