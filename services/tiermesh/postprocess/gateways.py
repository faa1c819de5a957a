"""Delivery of finished results to the gateways that own them, one call per gateway."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from tiermesh.core.jobs import JobResult
from tiermesh.core.server import make_channel
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc


class GatewayClients:
    """One channel per gateway address, opened on first use, closed by `close`; TLS with
    `credentials` (internal mTLS), plaintext when None."""

    def __init__(
        self,
        telemetry: Telemetry,
        timeout_s: float,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._timeout_s = timeout_s
        self._credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def deliver(self, address: str, results: Sequence[JobResult]) -> None:
        """Raises AioRpcError when the gateway cannot be reached."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = make_channel(
                address, self._telemetry, credentials=self._credentials
            )
        stub = delivery_pb2_grpc.DeliveryStub(channel)
        msg = delivery_pb2.Deliveries(results=[result_to_proto(r) for r in results])
        await stub.Deliver(msg, timeout=self._timeout_s)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
