"""The internal Delivery servicer of the gateway: postprocess hands over finished results
(messages on its DeliverStream, or unary Deliver calls), the waiting calls (pending.py) are
resolved. No span here: a traced request's `deliver` span is built with its other hop
spans once its call has the result (hop_spans.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import structlog

from tiermesh.core.call_stream import StreamServing
from tiermesh.core.grpc_errors import grpc_method
from tiermesh.core.jobs import JobResult
from tiermesh.core.wire import result_from_proto
from tiermesh.gateway.pending import PendingRequests
from tiermesh.rollout.recorder import OutcomeRecorder, is_shadow
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc

log = structlog.get_logger("tiermesh.gateway")


class DeliveryServicer(delivery_pb2_grpc.DeliveryServicer):
    """Postprocess calls Deliver with the finished results for this gateway's requests."""

    def __init__(self, pending: PendingRequests, recorder: OutcomeRecorder | None = None) -> None:
        self._pending = pending
        self._recorder = recorder
        self._streams = StreamServing("delivery")

    def drain(self) -> None:
        """At stop, once nothing waits here: postprocess's streams end."""
        self._streams.drain()

    async def DeliverStream(
        self,
        request_iterator: AsyncIterator[delivery_pb2.Deliveries],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[delivery_pb2.DeliverReply]:
        async for reply in self._streams.serve(request_iterator, self._deliver, context):
            yield reply

    @grpc_method
    async def Deliver(self, request, context):  # type: ignore[no-untyped-def]
        return await self._deliver(request)

    async def _deliver(self, request: delivery_pb2.Deliveries) -> delivery_pb2.DeliverReply:
        resolved = late = 0
        for msg in request.results:
            result = result_from_proto(msg)
            if result.partial:  # a piece of a streamed answer: no span per token
                if self._pending.resolve(result):
                    resolved += 1
                else:
                    late += 1
                continue
            if is_shadow(result):  # a canary's answer to a mirrored copy: nobody waits
                if self._recorder is not None:
                    self._recorder.shadow(result)
                continue
            resolved, late = self._resolve(result, resolved, late)
        return delivery_pb2.DeliverReply(resolved=resolved, late=late)

    def _resolve(self, result: JobResult, resolved: int, late: int) -> tuple[int, int]:
        if self._pending.resolve(result):
            return resolved + 1, late
        log.info("late result dropped", request_id=result.request_id)
        return resolved, late + 1
