"""What the services do differently on a Redis Cluster: reads of keys in several slots, and
writes that count only once a replica has them. On one server each is the plain command."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, cast
from weakref import WeakKeyDictionary

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError


def is_cluster(client: object) -> bool:
    return isinstance(client, aioredis.RedisCluster | redis.RedisCluster)


async def get_many(client: aioredis.Redis, names: Sequence[str]) -> list[bytes | None]:
    """The values of `names`, in order, in one round trip: MGET on one server, a pipeline
    of GETs on a cluster (whose MGET takes keys of one slot only)."""
    if not names:
        return []
    if not is_cluster(client):
        return cast(list[bytes | None], await client.mget(names))
    async with client.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.get(name)
        return cast(list[bytes | None], await pipe.execute())


# A write the mesh reports as done once it is in Redis (a job accepted, a batch input queued,
# a batch result recorded) waits, on a Redis Cluster, until a replica of its primary has it
# (WAIT, in the write's own round trip): a primary that fails over after that loses none of
# them. At most REPLICA_WAIT_MS: past it the write stands on the primary alone, and that
# primary (it has no replica, as after a failover until the old primary comes back as one)
# is not waited on for NO_REPLICA_RETRY_S; then one write finds out again.
REPLICA_WAIT_MS = 250
NO_REPLICA_RETRY_S = 5.0
# Per cluster client: primary -> until when it is not waited on (time.monotonic()).
_no_replica: WeakKeyDictionary[object, dict[str, float]] = WeakKeyDictionary()


def wait_for_replicas(
    client: aioredis.Redis, pipe: Any, names: Iterable[str], wait_ms: int = REPLICA_WAIT_MS
) -> list[str]:
    """On a cluster, queue on `pipe`, after the writes to `names`, a WAIT of at most
    `wait_ms` for one replica of each primary holding them (but those found without one
    lately): the primaries waited on, in the order of their replies, which end the
    pipeline's. Nothing on one server."""
    if not is_cluster(client):
        return []
    cluster = cast(aioredis.RedisCluster, client)
    skip, now = _no_replica.get(client, {}), time.monotonic()
    nodes = {}
    for name in names:
        node = cluster.get_node_from_key(name)
        if node is not None and skip.get(node.name, 0.0) <= now:
            nodes[node.name] = node
    for node in nodes.values():
        pipe.execute_command("WAIT", 1, wait_ms, target_nodes=node)
    return list(nodes)


async def execute_replicated(client: aioredis.Redis, pipe: Any, names: Iterable[str]) -> list[Any]:
    """Execute `pipe` (its writes to `names`) and wait_for_replicas in the same round trip:
    the replies of the pipeline's own commands."""
    waited = wait_for_replicas(client, pipe, names)
    replies = await pipe.execute()
    if not waited:
        return cast(list[Any], replies)
    acked, replies = replies[-len(waited) :], replies[: -len(waited)]
    for node, count in zip(waited, acked, strict=True):
        if count == 0:  # no replica answered within REPLICA_WAIT_MS
            _no_replica.setdefault(client, {})[node] = time.monotonic() + NO_REPLICA_RETRY_S
    return cast(list[Any], replies)


async def run_script(
    client: aioredis.Redis, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """`script(keys=keys, args=args)`, its write waited for as wait_for_replicas says (in
    the same round trip), its keys all in one slot."""
    if not is_cluster(client):
        return await script(keys=keys, args=args)
    for attempt in (1, 2):
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
                return (await execute_replicated(client, pipe, keys[:1]))[0]
        except NoScriptError:  # a node that lost it (restarted, promoted, flushed)
            if attempt == 2:
                raise
            await client.script_load(script.script)
