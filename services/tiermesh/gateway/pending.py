"""Requests the gateway is waiting on, and their results: each answered exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tiermesh.core.jobs import JobResult

# Called with each piece of a generative answer a streaming caller waits on.
PartialCallback = Callable[[JobResult], None]


class PendingRequests:
    """Futures keyed by request id. Resolving an id twice, or after its caller left, is late.
    Pieces (partial results) go to the caller's callback until its final result."""

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[JobResult]] = {}
        self._partial: dict[str, PartialCallback] = {}
        self.late = 0
        self._empty = asyncio.Event()
        self._empty.set()

    def register(
        self, request_id: str, on_partial: PartialCallback | None = None
    ) -> asyncio.Future[JobResult]:
        """Called before the job is routed, so a fast result always finds its future."""
        fut: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = fut
        if on_partial is not None:
            self._partial[request_id] = on_partial
        self._empty.clear()
        return fut

    def discard(self, request_id: str) -> None:
        """Called when the caller's handler ends, however it ends."""
        fut = self._waiting.pop(request_id, None)
        self._partial.pop(request_id, None)
        if fut is not None and not fut.done():
            fut.cancel()
        if not self._waiting:
            self._empty.set()

    def resolve(self, result: JobResult) -> bool:
        """Hand a result to its waiting caller; False (and counted late) when nobody waits."""
        fut = self._waiting.get(result.request_id)
        if result.partial:
            callback = self._partial.get(result.request_id)
            if callback is None or fut is None or fut.done():
                self.late += 1
                return False
            callback(result)
            return True
        if fut is None or fut.done():
            self.late += 1
            return False
        fut.set_result(result)
        return True

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait_empty(self) -> None:
        await self._empty.wait()
