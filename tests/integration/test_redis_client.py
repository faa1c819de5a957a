"""core/redis_client.connect: a pooled connection that Redis closed (as after a restart) is
opened again for the next command instead of failing it."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

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
