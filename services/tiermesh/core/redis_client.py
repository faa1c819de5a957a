"""The one way services connect to Redis."""

from __future__ import annotations

import redis.asyncio as aioredis

# Enough for a service's concurrent calls; beyond it callers wait for a free connection
# (redis-py's default pool raises MaxConnectionsError at 100 instead, which surfaced as
# "redis down" under load).
MAX_CONNECTIONS = 256
POOL_WAIT_S = 5.0


def connect(url: str) -> aioredis.Redis:
    """A client whose pool waits for a free connection instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=MAX_CONNECTIONS, timeout=POOL_WAIT_S
    )
    return aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes it
