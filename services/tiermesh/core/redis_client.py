"""The one way services connect to Redis."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    ConnectionError,
    NoPermissionError,
    RedisError,
    ResponseError,
)

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


class RedisRefused(Exception):
    """Redis refused this service's credentials: waiting would not help, so the service does
    not start (its __main__ says so in one line)."""


# How Redis words a refusal of credentials or rights (redis-py raises some of them as
# ResponseError).
_REFUSALS = ("NOAUTH", "WRONGPASS", "NOPERM", "invalid password", "Authentication required")


async def check_access(client: aioredis.Redis, url: str) -> None:
    """Called once at start: RedisRefused when Redis refuses the credentials of `url` (none
    given to a Redis with a password, a wrong one, an ACL user without rights). Redis down
    or loading is not fatal: the services wait for it and answer UNAVAILABLE meanwhile."""
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        if not refuses_credentials(exc):
            return  # down or loading: not fatal
        raise RedisRefused(
            f"Redis at {where(url)} refused this service's credentials ({exc}); give the "
            "password (and user) in TIERMESH_REDIS_URL: redis://[USER]:PASSWORD@HOST:PORT/0"
        ) from None


def refuses_credentials(exc: BaseException) -> bool:
    """Whether a Redis error is a refusal of the client's credentials or rights (waiting
    would not help), not Redis being down or loading."""
    if isinstance(exc, AuthenticationError | NoPermissionError):
        return True
    return isinstance(exc, ResponseError) and any(r in str(exc) for r in _REFUSALS)


def where(url: str) -> str:
    """host:port of a Redis URL, without its credentials."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}:{parts.port or 6379}"
