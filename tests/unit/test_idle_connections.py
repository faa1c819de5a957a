"""The public ports close connections that carry no call: gRPC after its idle time (GOAWAY)
and before a handshake that never finishes, REST between requests and while request headers
never finish (aiohttp held such a connection an hour)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace

from tiermesh.core.server import (
    MAX_STREAMS_PER_CONNECTION,
    add_health,
    public_connection_options,
)
from tiermesh.core.settings import GatewaySettings
from tiermesh.gateway.rest import RestDoor

IDLE_S = 0.5
FRONT_DOOR = Path(__file__).parents[2] / "services/tiermesh/frontdoor/go"


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection (a deadline, not a sleep)."""
    return await asyncio.wait_for(reader.read(), 10)


async def test_grpc_closes_an_idle_connection_and_an_unfinished_handshake() -> None:
    server = grpc.aio.server(options=public_connection_options(IDLE_S))
    add_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            await asyncio.wait_for(
                channel.wait_for_state_change(grpc.ChannelConnectivity.READY), 10
            )
            assert channel.get_state() == grpc.ChannelConnectivity.IDLE
        # A client that connects and says nothing: closed (the wait would time out else).
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await _closed(reader)
        writer.close()
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n"],
    ids=["nothing", "headers that never end"],
)
async def test_rest_closes_an_idle_connection(sent: bytes) -> None:
    settings = GatewaySettings(http_port=0, idle_connection_s=IDLE_S)
    door = RestDoor(None, settings, trace.get_tracer("test"))  # type: ignore[arg-type]
    port = await door.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        await writer.drain()
        assert await _closed(reader) == b""
        writer.close()
    finally:
        await door.stop()


def test_the_front_door_bounds_its_connections_as_the_gateway_does() -> None:
    source = (FRONT_DOOR / "main.go").read_text()
    found = re.search(r"const maxStreamsPerConnection = (\d+)", source)
    assert found is not None and int(found.group(1)) == MAX_STREAMS_PER_CONNECTION
    assert 'envSeconds("TIERMESH_IDLE_CONNECTION_S", 120)' in source
    assert GatewaySettings().idle_connection_s == 120
