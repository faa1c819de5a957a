"""The latency proxy against a real echo server on port 0: bytes arrive intact and in
order, never earlier than the configured round trip, and closing the proxy closes its
connections."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from tiermesh.up.latency_proxy import LatencyProxy

pytestmark = pytest.mark.integration

RTT_MS = 100.0
PAYLOAD_BYTES = 1 << 20


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.write_eof()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def echo() -> AsyncIterator[tuple[str, int]]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    yield str(host), int(port)
    server.close()
    await server.wait_closed()


@pytest.fixture
async def proxy(echo: tuple[str, int]) -> AsyncIterator[tuple[LatencyProxy, int]]:
    p = LatencyProxy(*echo, rtt_ms=RTT_MS)
    _, port = await p.start("127.0.0.1", 0)
    yield p, port
    await p.close()


async def _round_trip_s(port: int) -> float:
    """Seconds (loop clock, the proxy's own) from sending one byte to reading it back."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        t0 = loop.time()
        writer.write(b"x")
        await writer.drain()
        assert await reader.readexactly(1) == b"x"
        return loop.time() - t0
    finally:
        writer.close()
        await writer.wait_closed()


async def test_round_trip_is_never_shorter_than_configured(
    proxy: tuple[LatencyProxy, int],
) -> None:
    _, port = proxy
    for _ in range(3):
        assert await _round_trip_s(port) >= RTT_MS / 1000


async def test_concurrent_megabytes_arrive_intact_and_in_order(
    proxy: tuple[LatencyProxy, int],
) -> None:
    _, port = proxy

    async def one(payload: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def send() -> None:
            view = memoryview(payload)
            for i in range(0, len(view), 7919):  # odd-sized pieces, interleaved with reads
                writer.write(view[i : i + 7919])
                await writer.drain()
            writer.write_eof()

        sending = asyncio.create_task(send())
        try:
            echoed = await reader.read()  # until the echo server's EOF, through the proxy
        finally:
            await sending
            writer.close()
            await writer.wait_closed()
        return echoed

    payloads = [os.urandom(PAYLOAD_BYTES) for _ in range(4)]
    echoed = await asyncio.wait_for(asyncio.gather(*(one(p) for p in payloads)), 60)
    assert [len(e) for e in echoed] == [PAYLOAD_BYTES] * 4
    assert echoed == payloads


async def test_close_closes_its_connections(proxy: tuple[LatencyProxy, int]) -> None:
    p, port = proxy
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    for reader, writer in conns:  # each served end to end before the proxy closes
        writer.write(b"ping")
        await writer.drain()
        assert await reader.readexactly(4) == b"ping"
    assert p.connections == 3
    await p.close()
    assert p.connections == 0
    for reader, writer in conns:
        # Aborted by the proxy: EOF or a reset, never more data.
        try:
            assert await asyncio.wait_for(reader.read(), 10) == b""
        except ConnectionResetError:
            pass
        writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
