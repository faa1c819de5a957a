"""A body the REST door answers without reading: up to LINGER_MAX_BYTES of it is read and
dropped after the answer (so that a caller which sends everything before it reads still
gets the answer, on a connection kept alive), past that the connection closes after the
answer; a caller that says `Expect: 100-continue` is refused 413 before it sends a body
that is over the limit, and told to continue otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from opentelemetry import trace

from tiermesh.core.settings import GatewaySettings
from tiermesh.gateway.rest import LINGER_MAX_BYTES, RestDoor

MIB = 1 << 20
LIMIT = 4 * MIB


@pytest.fixture
async def port() -> AsyncIterator[int]:
    # No data plane: these requests end before any handler reaches it.
    settings = GatewaySettings(http_port=0, max_request_bytes=LIMIT)
    door = RestDoor(None, settings, trace.get_tracer("test"))  # type: ignore[arg-type]
    try:
        yield await door.start()
    finally:
        await door.stop()


def head(path: str, length: int, *extra: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {length}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader) -> int:
    """The status of the next response on the connection; its headers and body read."""
    line = await asyncio.wait_for(reader.readline(), 10)
    status = int(line.split()[1])
    length = 0
    while (header := await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    await asyncio.wait_for(reader.readexactly(length), 10)
    return status


async def ended(reader: asyncio.StreamReader) -> bool:
    """Whether the connection ended (closed or reset) with nothing more sent on it."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionError:
        return True


async def send_until_closed(writer: asyncio.StreamWriter, total: int) -> int:
    """Send up to `total` zero bytes; how many went before the server closed (a deadline on
    each write, not a sleep)."""
    chunk = bytes(256 * 1024)
    sent = 0
    try:
        while sent < total:
            writer.write(chunk)
            await asyncio.wait_for(writer.drain(), 10)
            sent += len(chunk)
    except (ConnectionError, TimeoutError):
        pass
    return sent


async def test_a_large_unread_body_closes_the_connection_after_the_answer(port: int) -> None:
    total = 200 * MIB
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("/no/such/path", total))
    sending = asyncio.create_task(send_until_closed(writer, total))
    # A caller that reads while it sends gets the answer.
    assert await status_of(reader) == 404
    sent = await sending
    # The server closed instead of reading 200 MB: the caller could not send it all.
    assert sent < total
    assert await ended(reader)
    writer.close()


async def test_a_small_unread_body_is_read_and_the_connection_kept(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):  # the second request proves the connection was kept alive
        writer.write(head("/no/such/path", LINGER_MAX_BYTES) + bytes(LINGER_MAX_BYTES))
        await writer.drain()
        assert await status_of(reader) == 404
    writer.close()


async def test_expect_continue_refuses_a_body_over_the_limit_before_it_is_sent(
    port: int,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("/v2/models/mlp/infer", LIMIT + 1, "Expect: 100-continue"))
    await writer.drain()
    assert await status_of(reader) == 413
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()


async def test_expect_continue_lets_a_body_within_the_limit_come(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("/v2/models/mlp/infer", LIMIT, "Expect: 100-continue"))
    await writer.drain()
    assert await asyncio.wait_for(reader.readline(), 10) == b"HTTP/1.1 100 Continue\r\n"
    writer.close()
