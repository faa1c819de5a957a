"""Hands a finished batch to postprocess: one message per batch on the worker's one
ProcessStream (core/call_stream.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import grpc
import structlog

from tiermesh.core.call_stream import CallStream
from tiermesh.core.jobs import JobResult
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import postprocess_pb2, postprocess_pb2_grpc

log = structlog.get_logger("tiermesh.worker")
HANDOFF_ATTEMPTS = 5


class PostprocessClient:
    """Owns the stream to postprocess: `close` ends it."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 10.0) -> None:
        stub = postprocess_pb2_grpc.PostprocessStub(channel)
        self._calls: CallStream[postprocess_pb2.ResultBatch, postprocess_pb2.ProcessReply] = (
            CallStream(stub.ProcessStream, "postprocess")
        )
        self._timeout_s = timeout_s

    async def process(self, results: Sequence[JobResult]) -> None:
        """Returns once postprocess accepted and delivered the batch; raises AioRpcError."""
        batch = postprocess_pb2.ResultBatch(results=[result_to_proto(r) for r in results])
        await self._calls.call(batch, self._timeout_s)

    @property
    def unsent(self) -> int:
        """Hand-offs whose batch is not on the wire to postprocess yet."""
        return self._calls.unsent

    async def close(self) -> None:
        await self._calls.close()


async def retrying(
    call: Callable[[], Awaitable[object]],
    errors: tuple[type[Exception], ...],
    failed: str,
) -> bool:
    """`call` until it succeeds, HANDOFF_ATTEMPTS times at most with a doubling pause;
    False when every attempt failed with one of `errors` (each logged as `failed`)."""
    for attempt in range(HANDOFF_ATTEMPTS):
        try:
            await call()
            return True
        except errors as exc:
            log.warning(failed, attempt=attempt + 1, error=str(exc))
            await asyncio.sleep(min(0.1 * 2**attempt, 1.0))
    return False
