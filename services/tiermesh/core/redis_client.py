"""The one way services connect to Redis: one server (`redis://`, `rediss://`) or a Redis
Cluster (`redis+cluster://` or `rediss+cluster://`, then one or more seed nodes separated by
commas, e.g. `redis+cluster://:PASSWORD@10.0.0.1:7000,10.0.0.2:7000`; the client learns
the others, follows MOVED and ASK, and finds a promoted replica after a failover)."""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
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
# A cluster client retries a command that met a node gone (a primary failing over) after
# refreshing its map of the slots: a few times, soon, so that a caller meanwhile is refused
# (UNAVAILABLE) within about half a second rather than held for redis-py's ten tries up to
# a second apart; the call after the replica's promotion finds it.
CLUSTER_RETRIES = 3
CLUSTER_BACKOFF_S = (0.05, 0.2)  # base, cap


CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def cluster_seeds(url: str) -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL as the URL of its first seed node (credentials and TLS options kept)
    and the (host, port) of every seed. Raises ValueError on a URL without a seed."""
    parts = urlsplit(url)
    scheme = CLUSTER_SCHEMES[parts.scheme]
    credentials, _, hosts = parts.netloc.rpartition("@")
    seeds = []
    for item in hosts.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{where(url)}: each seed node is HOST:PORT, not {item!r}")
        seeds.append((host.strip("[]"), int(port)))
    first = f"{credentials}@{hosts.split(',')[0]}" if credentials else hosts.split(",")[0]
    return urlunsplit((scheme, first, "", parts.query, "")), seeds


def connect(url: str) -> aioredis.Redis:
    """A client whose pool waits for a free connection instead of failing; a cluster client
    for a cluster URL."""
    if is_cluster_url(url):
        first, seeds = cluster_seeds(url)
        cluster = aioredis.RedisCluster.from_url(
            first,
            startup_nodes=[ClusterNode(host, port) for host, port in seeds[1:]],
            max_connections=MAX_CONNECTIONS,
            socket_connect_timeout=CONNECT_TIMEOUT_S,
            socket_timeout=SOCKET_TIMEOUT_S,
            retry=Retry(ExponentialWithJitterBackoff(*CLUSTER_BACKOFF_S), CLUSTER_RETRIES),
        )
        # It answers every command the services send, routed to the slot's node (the
        # cluster-mode e2e runs check it); typed as the one client the services are
        # written against.
        return cast(aioredis.Redis, cluster)
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


def connect_sync(url: str, **options: Any) -> redis.Redis:
    """A blocking client (for threads and command-line tools), a cluster client for a
    cluster URL; `options` as redis-py's (socket_timeout...)."""
    if is_cluster_url(url):
        first, seeds = cluster_seeds(url)
        nodes = [redis.cluster.ClusterNode(host, port) for host, port in seeds[1:]]  # type: ignore[no-untyped-call]
        return cast(redis.Redis, redis.RedisCluster.from_url(first, startup_nodes=nodes, **options))
    return redis.Redis.from_url(url, **options)


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
