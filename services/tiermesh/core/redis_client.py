"""The one way services connect to Redis."""

from __future__ import annotations

import redis.asyncio as aioredis

# Enough for a service's concurrent calls; beyond it callers wait for a free connection
# (redis-py's default pool raises MaxConnectionsError at 100 instead, which surfaced as
# "redis down" under load).
MAX_CONNECTIONS = 256
POOL_WAIT_S = 5.0
# A dead Redis refuses connections at once; a hung one (stopped, partitioned) must not hold
# callers for long either: they answer UNAVAILABLE instead. Reads block at most
# poll_block_ms (well under SOCKET_TIMEOUT_S).
CONNECT_TIMEOUT_S = 1.0
SOCKET_TIMEOUT_S = 5.0


def connect(url: str) -> aioredis.Redis:
    """A client whose pool waits for a free connection instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
    )
    return aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes it
