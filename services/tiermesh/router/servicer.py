"""The Router servicer: a long-lived stream of job batches in, batches of outcomes out.

Per stream, a reader takes batches off the wire as they come and a router loop handles
what arrived meanwhile as one batch (routing.BatchRouter): at concurrency 1 a batch is one
job and waits for nothing; under load batches fill by themselves while the previous one is
in Redis. Outcomes go back as soon as their batch is decided. Proto types stop here.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import structlog

from tiermesh.core.call_stream import Drain
from tiermesh.core.errors import INTERNAL_MESSAGE, MeshError, code_to_int
from tiermesh.core.wire import job_from_proto
from tiermesh.router.routing import BatchRouter, Outcome, Placed
from tiermesh.v1 import job_pb2, router_pb2, router_pb2_grpc

log = structlog.get_logger("tiermesh.router")


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, router: BatchRouter) -> None:
        self._router = router
        self._stop = Drain()
        self.batches = 0  # routed, for the stop line: jobs / batches is how well hops batch
        self.jobs = 0

    def drain(self) -> None:
        """At stop: each stream answers the jobs it has read, then ends. A gateway sends what
        it had on that stream again on a new one (to another router, or to this one once it
        is back), so a router stops in a moment, not after the whole grace period."""
        self._stop.drain()

    async def RouteStream(
        self,
        request_iterator: AsyncIterator[router_pb2.JobBatch],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[router_pb2.RouteReplies]:
        arrived: list[job_pb2.Job] = []
        more = asyncio.Event()
        ended = False

        async def read() -> None:
            nonlocal ended
            try:
                async for batch in request_iterator:
                    arrived.extend(batch.jobs)
                    more.set()
            finally:
                ended = True
                more.set()

        reader = asyncio.create_task(read(), name="route-stream-reader")  # owned: this call
        try:
            with self._stop.watching(more):
                while True:
                    await more.wait()
                    more.clear()
                    if arrived:
                        messages, arrived[:] = list(arrived), []
                        yield await self._route(messages)
                    # Draining: what a busy gateway sent meanwhile goes again on its next stream.
                    if self._stop.draining or (ended and not arrived):
                        break
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _route(self, messages: list[job_pb2.Job]) -> router_pb2.RouteReplies:
        jobs = [job_from_proto(m) for m in messages]
        self.batches += 1
        self.jobs += len(jobs)
        try:
            outcomes = await self._router.route_batch(jobs)
        except Exception:
            log.exception("unexpected error routing a batch", jobs=len(jobs))
            outcomes = [MeshError(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)] * len(jobs)
        return router_pb2.RouteReplies(
            replies=[reply_of(j.request_id, o) for j, o in zip(jobs, outcomes, strict=True)]
        )


def reply_of(request_id: str, outcome: Outcome) -> router_pb2.RouteReply:
    if isinstance(outcome, Placed):
        return router_pb2.RouteReply(
            request_id=request_id,
            stream=outcome.stream,
            entry_id=outcome.entry_id,
            version=outcome.version,
            shadow_request_id=outcome.shadow_request_id,
        )
    reply = router_pb2.RouteReply(
        request_id=request_id, code=code_to_int(outcome.code), message=outcome.message
    )
    if outcome.retry_after_ms is not None:
        reply.retry_after_ms = outcome.retry_after_ms
    return reply
