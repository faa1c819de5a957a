"""Delivery of finished results to the gateways that own them: per batch one message to each
gateway, on one DeliverStream per gateway (core/call_stream.py)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from tiermesh.core.call_stream import CallStream
from tiermesh.core.jobs import JobResult
from tiermesh.core.server import make_channel
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc

Calls = CallStream[delivery_pb2.Deliveries, delivery_pb2.DeliverReply]


class GatewayClients:
    """One channel and one stream per gateway address, opened on first use, closed by
    `close`; TLS with `credentials` (internal mTLS), plaintext when None."""

    def __init__(
        self,
        timeout_s: float,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._credentials = credentials
        self._channels: dict[str, tuple[grpc.aio.Channel, Calls]] = {}

    async def deliver(self, address: str, results: Sequence[JobResult]) -> None:
        """Raises AioRpcError when the gateway cannot be reached."""
        opened = self._channels.get(address)
        if opened is None:
            channel = make_channel(address, credentials=self._credentials)
            stub = delivery_pb2_grpc.DeliveryStub(channel)
            opened = self._channels[address] = (channel, CallStream(stub.DeliverStream, address))
        _, calls = opened
        msg = delivery_pb2.Deliveries(results=[result_to_proto(r) for r in results])
        await calls.call(msg, self._timeout_s)

    async def close(self) -> None:
        for channel, calls in self._channels.values():
            await calls.close()
            await channel.close()
        self._channels.clear()
