"""Hands a finished batch to postprocess."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from tiermesh.core.jobs import JobResult
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import postprocess_pb2, postprocess_pb2_grpc


class PostprocessClient:
    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 10.0) -> None:
        self._stub = postprocess_pb2_grpc.PostprocessStub(channel)
        self._timeout_s = timeout_s

    async def process(self, results: Sequence[JobResult]) -> None:
        """Returns once postprocess accepted and delivered the batch; raises AioRpcError."""
        batch = postprocess_pb2.ResultBatch(results=[result_to_proto(r) for r in results])
        await self._stub.Process(batch, timeout=self._timeout_s)
