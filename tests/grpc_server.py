"""A test servicer on a real grpc.aio server on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc


@contextlib.asynccontextmanager
async def serving(
    add: Callable[[Any, grpc.aio.Server], None],
    servicer: object,
    server: grpc.aio.Server | None = None,
) -> AsyncIterator[str]:
    """Registers `servicer` with its generated `add_...Servicer_to_server` on `server` (a
    bare grpc.aio server when None), starts it and yields its address; stops it after."""
    server = server or grpc.aio.server()
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)
