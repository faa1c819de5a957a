"""Delivery of finished results to the gateways that own them: per batch one message to each
gateway (more where its results exceed the message limit together; core/message_bytes.py),
on one DeliverStream per gateway (core/call_stream.py). Postprocess delivers what it
processed; a worker delivers a batch with no output step left to run itself."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter

from tiermesh.core.call_stream import CallStream
from tiermesh.core.jobs import JobResult
from tiermesh.core.message_bytes import MAX_MESSAGE_BYTES, result_messages
from tiermesh.core.server import make_channel
from tiermesh.core.settings import PostprocessSettings, WorkerSettings
from tiermesh.core.tls import internal_channel_credentials
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import delivery_pb2, delivery_pb2_grpc

log = structlog.get_logger("tiermesh.delivery")
Calls = CallStream[delivery_pb2.Deliveries, delivery_pb2.DeliverReply]


def deliveries_counter(registry: CollectorRegistry) -> Counter:
    """`tiermesh_deliveries{outcome}` of the process that delivers (postprocess, a worker)."""
    return Counter(
        "tiermesh_deliveries",
        "Results handed to gateways, by outcome",
        ["outcome"],
        registry=registry,
    )


@dataclass(frozen=True)
class Delivered:
    """What one batch's delivery came to: results a gateway took, and results whose gateway
    could not be reached (its callers are gone with it: counted and dropped)."""

    delivered: int = 0
    undeliverable: int = 0

    def count(self, counter: Counter | None) -> None:
        if counter is not None:
            counter.labels("delivered").inc(self.delivered)
            counter.labels("undeliverable").inc(self.undeliverable)


class GatewayClients:
    """One channel and one stream per gateway address, opened on first use, closed by
    `close`; TLS with `credentials` (internal mTLS; each gateway's certificate checked
    against `server_name` when given, else its address), plaintext when None. No message is
    over `max_message_bytes` (the gateways' Delivery servers take as much): an answer that
    alone is goes to its caller as RESOURCE_EXHAUSTED, its batch-mates as they are."""

    @classmethod
    def from_settings(cls, settings: PostprocessSettings | WorkerSettings) -> GatewayClients:
        """Deliveries as postprocess (or a worker delivering directly) makes them: over
        internal TLS where configured, within settings.delivery_timeout_ms."""
        return cls(
            settings.delivery_timeout_ms / 1000,
            internal_channel_credentials(settings),
            settings.max_message_bytes,
            settings.delivery_tls_server_name,
        )

    def __init__(
        self,
        timeout_s: float,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        server_name: str = "",
    ) -> None:
        self._timeout_s = timeout_s
        self._credentials = credentials
        self._max_message_bytes = max_message_bytes
        self._server_name = server_name
        self._channels: dict[str, tuple[grpc.aio.Channel, Calls]] = {}

    async def deliver(self, address: str, results: Sequence[JobResult]) -> None:
        """One message of `results` (within the message limit: see `deliver_all`) to the
        gateway at `address`; raises AioRpcError when it cannot be reached."""
        opened = self._channels.get(address)
        if opened is None:
            channel = make_channel(
                address, self._max_message_bytes, self._credentials, self._server_name
            )
            stub = delivery_pb2_grpc.DeliveryStub(channel)
            opened = self._channels[address] = (channel, CallStream(stub.DeliverStream, address))
        _, calls = opened
        msg = delivery_pb2.Deliveries(results=[result_to_proto(r) for r in results])
        await calls.call(msg, self._timeout_s)

    async def deliver_all(self, results: Sequence[JobResult]) -> Delivered:
        """Every result to its gateway, all at once: one message per gateway, or as many as
        its results need to stay within the message limit."""
        by_gateway: dict[str, list[JobResult]] = defaultdict(list)
        for result in results:
            by_gateway[result.gateway].append(result)
        messages = [
            (gateway, part)
            for gateway, mine in by_gateway.items()
            for part in result_messages(mine, self._max_message_bytes)
        ]
        if len(messages) == 1:  # the common case: no task to start and wait for
            reached = [await self._reached(*messages[0])]
        else:
            reached = await asyncio.gather(*(self._reached(*m) for m in messages))
        delivered = sum(len(part) for (_, part), ok in zip(messages, reached, strict=True) if ok)
        return Delivered(delivered, len(results) - delivered)

    async def _reached(self, gateway: str, results: Sequence[JobResult]) -> bool:
        """Whether `gateway` took `results` (False: it could not be reached)."""
        try:
            await self.deliver(gateway, results)
        except grpc.aio.AioRpcError:
            log.warning("gateway unreachable", gateway=gateway, n=len(results))
            return False
        return True

    @property
    def unsent(self) -> int:
        """Deliveries whose message is not on the wire yet."""
        return sum(calls.unsent for _, calls in self._channels.values())

    async def close(self) -> None:
        for channel, calls in self._channels.values():
            await calls.close()
            await channel.close()
        self._channels.clear()
