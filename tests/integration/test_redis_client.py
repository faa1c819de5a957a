"""core/redis_client.connect: a pooled connection that Redis closed (as after a restart) is
opened again for the next command instead of failing it; replies are parsed by hiredis."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
from redis._parsers.hiredis import _AsyncHiredisParser

from tiermesh.core.redis_client import connect

pytestmark = pytest.mark.integration


async def test_a_connection_closed_by_redis_is_opened_again(redis_url: str) -> None:
    client = connect(redis_url)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        await client.set("tm:test:reconnect", b"1")
        own_id = await client.client_id()
        assert await admin.client_kill_filter(_id=own_id) == 1
        assert await client.get("tm:test:reconnect") == b"1"
        assert await client.client_id() != own_id  # a new connection served it
    finally:
        await client.delete("tm:test:reconnect")
        await client.aclose()
        await admin.aclose()


async def test_replies_are_parsed_in_c(redis_url: str) -> None:
    """hiredis (redis-py's `hiredis` extra, a dependency) parses every reply: without it
    redis-py falls back to its Python parser silently, at twice the CPU of a batch read."""
    client = connect(redis_url)
    try:
        await client.xadd("tm:test:parser", {b"job": b"x" * 64})
        connection = client.connection_pool.make_connection()
        assert isinstance(connection._parser, _AsyncHiredisParser)
        assert (await client.xrange("tm:test:parser"))[0][1] == {b"job": b"x" * 64}
    finally:
        await client.delete("tm:test:parser")
        await client.aclose()
