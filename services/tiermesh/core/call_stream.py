"""Work carried on one long-lived bidirectional stream per pair of processes (DESIGN.md,
"Internal hops carry batches"). `StreamPump` keeps the stream and is shared by every hop;
`CallStream` (worker -> postprocess, postprocess -> gateway) makes request/reply calls of
it, where each message is a whole batch with a `batch_id` that its reply echoes, replies in
any order; `StreamServing` is their server side. The gateway's router stream (gateway/
upstream.py) runs on the pump with its own batching of jobs; `Drain` ends every server's
streams at stop, the router's included.

A stream message costs less CPU on both ends than a unary call (no call set-up, no
metadata, no status) and arrives sooner after idle (benchmarks/grpc_hops.py). The
guarantees stay those of a unary call: a caller has its reply, or an AioRpcError (the
stream's own, UNAVAILABLE when the stream ended without one, DEADLINE_EXCEEDED after its
timeout) and sends again; a message is handled at most once per stream it was written on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

import grpc
import structlog

from tiermesh.core.errors import INTERNAL_MESSAGE

log = structlog.get_logger("tiermesh.stream")


class BatchMessage(Protocol):
    batch_id: int


Req = TypeVar("Req", bound=BatchMessage)
Rep = TypeVar("Rep", bound=BatchMessage)
Out = TypeVar("Out")
In = TypeVar("In")
K = TypeVar("K")


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class StreamPump(Generic[Out, In, K]):
    """Keeps one long-lived bidirectional stream to one peer while there is something to
    send or to wait for, and owns its writer and reader tasks (`close` ends them).

    The owner queues its work and calls `wake`; the pump writes what `take` returns (a
    message and the keys of the work it carries; None: nothing to send), each message as
    soon as the previous one is on the wire, and hands each message read to `answered`
    with the keys still unanswered on this stream (it discards those it answers). When the
    stream breaks or ends, `broken` gets the keys written on it and never answered, with
    the AioRpcError a unary call would have raised (UNAVAILABLE where the stream ended
    without one); the next work opens a new stream.

    `serial`: the next message waits until every key written is answered (one message in
    flight). For a peer that handles one message of a stream at a time (the router): what
    is queued meanwhile would wait in the peer's intake anyway, and goes as one message
    instead of one per piece of work, each costing both ends a message. No timer: at
    concurrency 1 nothing waits; under load a message holds what came in one round trip."""

    def __init__(
        self,
        open_stream: Callable[[], Any],
        name: str,
        take: Callable[[], tuple[Out, Iterable[K]] | None],
        answered: Callable[[In, set[K]], None],
        broken: Callable[[set[K], grpc.aio.AioRpcError], None],
        serial: bool = False,
    ) -> None:
        # open_stream: the stub's stream-stream method, called with no request iterator.
        self._open = open_stream
        self._serial = serial
        self._name = name
        self._take = take
        self._answered = answered
        self._broken = broken
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.messages = 0  # written, for tests and statistics
        self.streams = 0  # opened
        self.writing = False  # a message is being written now

    def wake(self) -> None:
        """Something was queued."""
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"{self._name}-stream")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _next(
        self, reader: asyncio.Task[Any] | None = None, sent: set[K] | None = None
    ) -> tuple[Out, Iterable[K]] | None:
        """The next work to send, once there is some (and, serial, once `sent` is all
        answered); None once `reader` (the stream's) is done: what is queued then goes on
        the next stream."""
        while reader is None or not reader.done():
            if not (self._serial and sent) and (taken := self._take()) is not None:
                return taken
            self._wake.clear()
            await self._wake.wait()
        return None

    async def _run(self) -> None:
        while True:
            taken = await self._next()
            stream = self._open()
            self.streams += 1
            sent: set[K] = set()
            reader = asyncio.create_task(self._read(stream, sent), name=f"{self._name}-reader")
            reader.add_done_callback(lambda _: self._wake.set())
            error: grpc.aio.AioRpcError | None = None
            try:
                while taken is not None:
                    message, keys = taken
                    sent.update(keys)  # before the write: a failed one is answered too
                    self.writing = True
                    try:
                        await stream.write(message)
                    finally:
                        self.writing = False
                    self.messages += 1
                    taken = await self._next(reader, sent)
                error = await reader
            except grpc.aio.AioRpcError:
                # A write fails once the stream is over (the peer ended it, or it broke;
                # grpc says INTERNAL, "error from Core"): the message never reached the
                # peer. How the stream ended, where the reader saw it, says more.
                if reader.done() and not reader.cancelled():
                    error = reader.result()
            except (grpc.aio.UsageError, asyncio.InvalidStateError) as err:
                error = rpc_error(grpc.StatusCode.UNAVAILABLE, str(err) or type(err).__name__)
            finally:
                if not reader.done():
                    reader.cancel()
                stream.cancel()
                ended = rpc_error(grpc.StatusCode.UNAVAILABLE, f"{self._name} stream ended")
                self._broken(sent, error or ended)

    async def _read(self, stream: Any, sent: set[K]) -> grpc.aio.AioRpcError | None:
        """Hand over what comes until the stream ends; its error, or None for a plain end."""
        try:
            async for reply in stream:
                self._answered(reply, sent)
                if self._serial and not sent:
                    self._wake.set()  # the next message may go
        except grpc.aio.AioRpcError as err:
            return err
        return None


class CallStream(Generic[Req, Rep]):
    """Request/reply calls on a StreamPump: `call` queues a message (its `batch_id` set
    here) and awaits the reply with that id; one message per call. `close` ends the
    stream; calls still waiting fail as UNAVAILABLE."""

    def __init__(self, open_stream: Callable[[], Any], name: str) -> None:
        self._name = name
        self._queued: collections.deque[Req] = collections.deque()
        self._waiting: dict[int, asyncio.Future[Rep]] = {}
        self._ids = itertools.count(1)
        self.pump: StreamPump[Req, Rep, int] = StreamPump(
            open_stream, name, self._take, self._answered, self._broken
        )

    async def call(self, message: Req, timeout_s: float) -> Rep:
        """The peer's reply to `message`; raises AioRpcError as a unary call would."""
        batch_id = message.batch_id = next(self._ids)
        future: asyncio.Future[Rep] = asyncio.get_running_loop().create_future()
        self._waiting[batch_id] = future
        self._queued.append(message)
        self.pump.wake()
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no reply from {self._name} in time"
            ) from None
        finally:
            del self._waiting[batch_id]
            if future.done() and not future.cancelled():
                future.exception()  # retrieved: a failure that raced a cancel is not logged

    @property
    def unsent(self) -> int:
        """Calls whose message is not on the wire yet (queued, or being written)."""
        return len(self._queued) + int(self.pump.writing)

    async def close(self) -> None:
        await self.pump.close()

    def _take(self) -> tuple[Req, tuple[int]] | None:
        while self._queued:
            message = self._queued.popleft()
            if message.batch_id in self._waiting:  # else its caller left
                return message, (message.batch_id,)
        return None

    def _answered(self, reply: Rep, sent: set[int]) -> None:
        sent.discard(reply.batch_id)
        future = self._waiting.get(reply.batch_id)
        if future is not None and not future.done():
            future.set_result(reply)

    def _broken(self, batch_ids: set[int], error: grpc.aio.AioRpcError) -> None:
        for batch_id in batch_ids:
            future = self._waiting.get(batch_id)
            if future is not None and not future.done():
                future.set_exception(error)


class Drain:
    """A servicer's stop for its long-lived streams: each stream's loop waits on an event it
    registers while it runs (`watching`); `drain()` sets `draining` and wakes them all, and
    each ends once what it has in hand is answered."""

    def __init__(self) -> None:
        self.draining = False
        self._wakes: set[asyncio.Event] = set()

    def drain(self) -> None:
        self.draining = True
        for wake in self._wakes:
            wake.set()

    @contextlib.contextmanager
    def watching(self, wake: asyncio.Event) -> Iterator[None]:
        self._wakes.add(wake)
        try:
            yield
        finally:
            self._wakes.discard(wake)


class StreamServing:
    """The server side, one per servicer: `serve` handles each message of a stream in a task
    of its own (a slow one holds up no other) and yields each reply, its `batch_id` set, as
    its handler returns. `drain` (at stop) ends every stream once its running handlers have
    replied; messages not yet read fail at their sender, who sends them again."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._stop = Drain()

    def drain(self) -> None:
        self._stop.drain()

    async def serve(
        self,
        requests: AsyncIterator[Req],
        handle: Callable[[Req], Coroutine[Any, Any, Rep]],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[Rep]:
        replies: collections.deque[Rep] = collections.deque()
        running: set[asyncio.Task[Rep]] = set()
        failed: list[BaseException] = []
        more = asyncio.Event()
        ended = False

        def finished(batch_id: int, task: asyncio.Task[Rep]) -> None:
            running.discard(task)
            if not task.cancelled():
                if (exc := task.exception()) is not None:
                    failed.append(exc)
                else:
                    reply = task.result()
                    reply.batch_id = batch_id
                    replies.append(reply)
            more.set()

        async def read() -> None:
            nonlocal ended
            try:
                async for message in requests:
                    if self._stop.draining:
                        break  # not begun: its sender sends it again
                    task: asyncio.Task[Rep] = asyncio.create_task(
                        handle(message), name=f"{self._name}-batch"
                    )
                    running.add(task)
                    task.add_done_callback(functools.partial(finished, message.batch_id))
            finally:
                ended = True
                more.set()

        reader = asyncio.create_task(read(), name=f"{self._name}-stream-reader")  # owned here
        try:
            with self._stop.watching(more):
                while True:
                    await more.wait()
                    more.clear()
                    while replies:
                        yield replies.popleft()
                    if failed:
                        log.error(
                            "unexpected error handling a batch",
                            stream=self._name,
                            exc_info=failed[0],
                        )
                        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
                    if (ended or self._stop.draining) and not running and not replies:
                        break
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            await asyncio.gather(reader, *running, return_exceptions=True)
