"""Hands a finished batch on: to postprocess, one message per batch on the worker's one
ProcessStream (core/call_stream.py), or, when no result of it has an output step left to
run, straight to the gateways that own them (`DirectHandoff`): one hop less per batch.
Either way no message exceeds the message limit (core/message_bytes.py): a batch whose
answers do not fit one goes in several, an answer that alone does not fails alone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import grpc
import structlog
from prometheus_client import CollectorRegistry, Counter

from tiermesh.core.call_stream import CallStream
from tiermesh.core.delivery_client import GatewayClients, deliveries_counter
from tiermesh.core.jobs import JobResult
from tiermesh.core.message_bytes import MAX_MESSAGE_BYTES, result_messages
from tiermesh.core.server import make_channel
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.tls import internal_channel_credentials
from tiermesh.core.wire import result_to_proto
from tiermesh.v1 import postprocess_pb2, postprocess_pb2_grpc

log = structlog.get_logger("tiermesh.worker")
HANDOFF_ATTEMPTS = 5


class Handoff(Protocol):
    """Where the worker's finished results go; `process` returns once they were delivered
    (or their gateway found gone) and raises AioRpcError when the next hop is unreachable."""

    async def process(self, results: Sequence[JobResult]) -> None: ...

    @property
    def unsent(self) -> int: ...

    async def close(self) -> None: ...


def skips_postprocess(results: Sequence[JobResult]) -> bool:
    """Whether a batch has nothing for postprocess to do: no result carries the inputs an
    output step reads (`aux`, e.g. the pooling mask), which the worker attaches exactly
    when a step is left to run (worker/results.py); a failed result passes postprocess
    untouched."""
    return not any(r.aux for r in results)


class PostprocessClient:
    """Owns the stream to postprocess: `close` ends it. `max_message_bytes`: what
    `channel` and postprocess's server take."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout_s: float = 10.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        stub = postprocess_pb2_grpc.PostprocessStub(channel)
        self._calls: CallStream[postprocess_pb2.ResultBatch, postprocess_pb2.ProcessReply] = (
            CallStream(stub.ProcessStream, "postprocess")
        )
        self._timeout_s = timeout_s
        self._max_message_bytes = max_message_bytes

    async def process(self, results: Sequence[JobResult]) -> None:
        """Returns once postprocess accepted and delivered the batch (one message, or several
        at once where it exceeds the message limit); raises AioRpcError."""
        parts = result_messages(results, self._max_message_bytes)
        if len(parts) == 1:
            await self._send(parts[0])
            return
        sent = await asyncio.gather(*(self._send(part) for part in parts), return_exceptions=True)
        for outcome in sent:  # every part had its turn; the first failure is the call's
            if isinstance(outcome, BaseException):
                raise outcome

    async def _send(self, results: Sequence[JobResult]) -> None:
        batch = postprocess_pb2.ResultBatch(results=[result_to_proto(r) for r in results])
        await self._calls.call(batch, self._timeout_s)

    @property
    def unsent(self) -> int:
        """Hand-offs whose batch is not on the wire to postprocess yet."""
        return self._calls.unsent

    async def close(self) -> None:
        await self._calls.close()


class DirectHandoff:
    """Owns the worker's delivery streams: a batch that `skips_postprocess` goes to its
    gateways from here (stamped postprocessed now, `direct`), any other to postprocess.
    `close` ends both."""

    def __init__(
        self,
        postprocess: PostprocessClient,
        gateways: GatewayClients,
        deliveries: Counter | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._postprocess = postprocess
        self._gateways = gateways
        self._deliveries = deliveries
        self._clock_ns = clock_ns

    async def process(self, results: Sequence[JobResult]) -> None:
        if not skips_postprocess(results):
            await self._postprocess.process(results)
            return
        now = self._clock_ns()
        stamped = [
            r.with_(timing=r.timing.with_(postprocessed_ns=now), direct=True) for r in results
        ]
        (await self._gateways.deliver_all(stamped)).count(self._deliveries)

    @property
    def unsent(self) -> int:
        return self._postprocess.unsent + self._gateways.unsent

    async def close(self) -> None:
        await self._postprocess.close()
        await self._gateways.close()


def handoff_for(
    settings: WorkerSettings, registry: CollectorRegistry
) -> tuple[Handoff, grpc.aio.Channel]:
    """Where the worker's finished batches go: postprocess at settings.postprocess_address,
    over an internal channel (returned, to close after the hand-off), and with
    TIERMESH_DIRECT_DELIVERY a batch without an output step left straight to its gateways."""
    channel = make_channel(
        settings.postprocess_address,
        settings.max_message_bytes,
        internal_channel_credentials(settings),
    )
    to_postprocess = PostprocessClient(channel, max_message_bytes=settings.max_message_bytes)
    if not settings.direct_delivery:
        return to_postprocess, channel
    gateways = GatewayClients.from_settings(settings)
    return DirectHandoff(to_postprocess, gateways, deliveries_counter(registry)), channel


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
