"""The one way services connect to Redis."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError

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
# A pooled connection that Redis closed (it restarted) fails on its next command; it is
# opened again and the command sent once more. Only for a closed connection: a timeout is
# a hung Redis, where a retry would only double the wait.
RECONNECT_RETRIES = 1


def connect(url: str) -> aioredis.Redis:
    """A client whose pool waits for a free connection instead of failing."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=POOL_WAIT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        retry=Retry(NoBackoff(), RECONNECT_RETRIES),
        retry_on_error=[ConnectionError],
    )
    return aioredis.Redis.from_pool(pool)  # owns the pool: aclose() closes it
