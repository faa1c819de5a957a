"""Calls over one long-lived stream (core/call_stream.py) against a real grpc.aio server on
port 0: replies matched by id in any order, a stream that ends or breaks fails only the
calls that were on it, drain waits for running handlers, errors are those of a unary call.
The server's handler is gated by events the test sets: nothing sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import pytest

from tiermesh.core.call_stream import CallStream, StreamServing
from tiermesh.v1 import postprocess_pb2, postprocess_pb2_grpc

Batch = postprocess_pb2.ResultBatch
Reply = postprocess_pb2.ProcessReply
Handler = Callable[[Batch], Awaitable[Reply]]


class Servicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(self) -> None:
        self.serving = StreamServing("test")
        self.handle: Handler = self.echo
        self.handled: list[int] = []  # batch ids, in the order handlers began
        self.streams = 0

    async def dispatch(self, batch: Batch) -> Reply:
        return await self.handle(batch)  # the handler the test set last

    async def echo(self, batch: Batch) -> Reply:
        self.handled.append(batch.batch_id)
        return Reply(delivered=len(batch.results))

    async def ProcessStream(
        self, request_iterator: AsyncIterator[Batch], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Reply]:
        self.streams += 1
        async for reply in self.serving.serve(request_iterator, self.dispatch, context):
            yield reply


@pytest.fixture
async def served() -> AsyncIterator[tuple[Servicer, CallStream[Batch, Reply]]]:
    servicer = Servicer()
    server = grpc.aio.server()
    postprocess_pb2_grpc.add_PostprocessServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    calls: CallStream[Batch, Reply] = CallStream(
        postprocess_pb2_grpc.PostprocessStub(channel).ProcessStream, "test"
    )
    try:
        yield servicer, calls
    finally:
        await calls.close()
        await channel.close()
        await server.stop(grace=None)


def batch(n: int) -> Batch:
    msg = Batch()
    for i in range(n):
        msg.results.add(request_id=f"r{i}")
    return msg


async def test_replies_find_their_calls_in_any_order(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served
    release: dict[int, asyncio.Event] = {}
    both_began = asyncio.Event()

    async def gated(msg: Batch) -> Reply:
        release[msg.batch_id] = gate = asyncio.Event()
        if len(release) == 2:
            both_began.set()
        await gate.wait()
        return Reply(delivered=len(msg.results))

    servicer.handle = gated
    first = asyncio.create_task(calls.call(batch(1), 10))
    second = asyncio.create_task(calls.call(batch(2), 10))
    async with asyncio.timeout(10):
        await both_began.wait()
    release[max(release)].set()  # the second one's reply comes first
    assert (await second).delivered == 2
    assert not first.done()
    release[min(release)].set()
    assert (await first).delivered == 1
    assert calls.pump.streams == 1 and calls.pump.messages == 2 and servicer.streams == 1


async def test_unsent_counts_calls_until_their_message_is_on_the_wire(served) -> None:  # type: ignore[no-untyped-def]
    """`unsent`: queued or being written; a call waiting only for its reply is not."""
    servicer, calls = served
    began = asyncio.Event()
    release = asyncio.Event()

    async def gated(msg: Batch) -> Reply:
        began.set()
        await release.wait()
        return Reply(delivered=len(msg.results))

    servicer.handle = gated
    assert calls.unsent == 0
    call = asyncio.create_task(calls.call(batch(3), 10))
    await asyncio.sleep(0)  # the call queued its message; the pump has not run yet
    assert calls.unsent == 1
    async with asyncio.timeout(10):
        await began.wait()  # the peer is handling it: it was written
    assert calls.unsent == 0 and not call.done()
    release.set()
    assert (await call).delivered == 3 and calls.unsent == 0


async def test_many_calls_share_one_stream(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served
    replies = await asyncio.gather(*(calls.call(batch(k % 5), 10) for k in range(50)))
    assert [r.delivered for r in replies] == [k % 5 for k in range(50)]
    assert sorted(servicer.handled) == sorted(set(servicer.handled))  # each handled once
    assert len(servicer.handled) == 50 and calls.pump.streams == 1 and servicer.streams == 1


async def test_drain_answers_running_batches_then_ends_the_stream(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(msg: Batch) -> Reply:
        started.set()
        await release.wait()
        return Reply(delivered=len(msg.results))

    servicer.handle = slow
    running = asyncio.create_task(calls.call(batch(3), 10))
    async with asyncio.timeout(10):
        await started.wait()
    servicer.serving.drain()
    assert not running.done()
    release.set()
    assert (await running).delivered == 3  # answered before the stream ended
    servicer.handle = servicer.echo
    # The stream ended with the drain; a later call (on it, or on a new one that a draining
    # server ends at once) hears UNAVAILABLE and is sent again, as after a broken call.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await calls.call(batch(1), 10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.handled == []  # never handled by a draining server


async def test_a_stream_opened_after_the_drain_ended_works_again(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served
    assert (await calls.call(batch(1), 10)).delivered == 1
    servicer.serving.drain()
    with pytest.raises(grpc.aio.AioRpcError):
        await calls.call(batch(1), 10)
    servicer.serving = StreamServing("test")  # the service back (a restarted replica)
    assert (await calls.call(batch(4), 10)).delivered == 4


async def test_a_late_reply_is_deadline_exceeded(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served
    never = asyncio.Event()

    async def stuck(msg: Batch) -> Reply:
        await never.wait()
        return Reply()

    servicer.handle = stuck
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await calls.call(batch(1), 0.05)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    servicer.handle = servicer.echo
    assert (await calls.call(batch(2), 10)).delivered == 2  # the stream is still good


async def test_a_failing_handler_fails_its_stream_as_internal(served) -> None:  # type: ignore[no-untyped-def]
    servicer, calls = served

    async def broken(msg: Batch) -> Reply:
        raise RuntimeError("bug")

    servicer.handle = broken
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await calls.call(batch(1), 10)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "bug" not in (err.value.details() or "")
    servicer.handle = servicer.echo
    assert (await calls.call(batch(1), 10)).delivered == 1


async def test_an_unreachable_peer_is_unavailable() -> None:
    from tiermesh.up.processes import free_port

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    calls: CallStream[Batch, Reply] = CallStream(
        postprocess_pb2_grpc.PostprocessStub(channel).ProcessStream, "nobody"
    )
    try:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await calls.call(batch(1), 10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await calls.close()
        await channel.close()
