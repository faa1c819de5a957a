"""The services' Redis side on a real local Redis Cluster (three primaries with a replica
each): the cluster URL, a model's keys in one slot, reads of several models' streams (one
XREADGROUP per slot, blocking on all at once), the admission script per model, writes
waited for on a replica, a script reloaded where a node lost it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import key_slot

from tests.redis_cluster import LocalCluster
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.redis_client import connect, connect_sync
from tiermesh.core.redis_cluster import (
    execute_replicated,
    get_many,
    is_cluster,
    run_script,
    wait_for_replicas,
)
from tiermesh.router.admission import Admitter, Enqueue
from tiermesh.worker.streams import STREAM_ERRORS, StreamClient

pytestmark = pytest.mark.integration

MLP = StreamKey(ComputeUnit("mlp", "1", "fp32"), "center", 1, 0)
# Another model, whose slot is on another primary than mlp's (checked below).
OTHER_NAMES = [f"m{i}" for i in range(50)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = LocalCluster(Path(tmp_path_factory.mktemp("cluster")))
    try:
        yield started.start()
    finally:
        started.stop()


@pytest.fixture
async def client(cluster: LocalCluster) -> AsyncIterator[aioredis.Redis]:
    cluster.flush()
    redis = connect(cluster.url)
    try:
        yield redis
    finally:
        await redis.aclose()


def other_model(cluster: LocalCluster) -> StreamKey:
    """A stream of a model whose primary is not mlp's."""
    mlp = cluster.primary_of(MLP.name)
    for name in OTHER_NAMES:
        stream = StreamKey(ComputeUnit(name, "1", "fp32"), "center", 1, 0)
        if cluster.primary_of(stream.name) is not mlp:
            return stream
    raise AssertionError("every model landed on mlp's primary")


def test_a_cluster_url_names_its_seeds_and_gives_cluster_clients(cluster: LocalCluster) -> None:
    sync = connect_sync(cluster.url, socket_timeout=5)
    try:
        assert is_cluster(sync)
        assert sync.ping()
        # Any one seed is enough: the client learns the rest.
        one = "redis+cluster://" + cluster.nodes[0].address
        assert connect_sync(one).cluster_nodes()  # type: ignore[attr-defined]
    finally:
        sync.close()
    with pytest.raises(ValueError, match="HOST:PORT"):
        connect("redis+cluster://127.0.0.1")


async def test_every_key_of_an_admission_lives_on_one_node(client: aioredis.Redis) -> None:
    """The admission script takes the stream, the workers set, the rate hash, the enqueue
    record and the model's streams: all in mlp's slot, so the cluster runs it."""
    assert key_slot(MLP.name.encode()) == key_slot(keys.enqueued_key(MLP.unit.model, "r").encode())
    await client.zadd(keys.workers_key(MLP.unit, MLP.tier), {"w": 2**52})
    admitter = Admitter(client)
    admission = await admitter.admit(
        MLP, 10, b"job", {}, request_id="r1", model_streams=[MLP], model_bound=10
    )
    assert admission.outcome == "ok"
    again = await admitter.admit(MLP, 10, b"job", {}, request_id="r1")
    assert (again.outcome, again.detail) == ("dup", admission.detail)
    assert await client.xlen(MLP.name) == 1


async def test_a_batch_of_two_models_is_one_call_per_model_in_order(
    client: aioredis.Redis, cluster: LocalCluster
) -> None:
    other = other_model(cluster)
    for stream in (MLP, other):
        await client.zadd(keys.workers_key(stream.unit, stream.tier), {"w": 2**52})
    items = [
        Enqueue(MLP, 10, b"a", {}, "r1"),
        Enqueue(other, 1, b"b", {}, "r2"),
        Enqueue(MLP, 10, b"c", {}, "r3"),
        Enqueue(other, 1, b"d", {}, "r4"),  # past other's bound of 1
    ]
    outcomes = [a.outcome for a in await Admitter(client).admit_many(items)]
    assert outcomes == ["ok", "ok", "ok", "full"]
    assert (await client.xlen(MLP.name), await client.xlen(other.name)) == (2, 1)


async def test_a_blocking_read_of_two_slots_returns_when_either_has_entries(
    client: aioredis.Redis, cluster: LocalCluster
) -> None:
    """One XREADGROUP per slot, blocking on both at once: an entry on either ends the read
    at once; the other read stays blocked, and what it gets comes with the next read."""
    other = other_model(cluster)
    streams = StreamClient(client, "w1")
    await streams.ensure_groups([MLP, other])
    block_ms = 5_000
    try:
        first = asyncio.ensure_future(streams.read([MLP, other], 10, block_ms))
        await client.xadd(other.name, {keys.JOB_FIELD: b"x"})
        got = await asyncio.wait_for(first, block_ms / 2000)  # not held to the block time
        assert [(e.stream, e.fields[keys.JOB_FIELD.encode()]) for e in got] == [(other, b"x")]
        await client.xadd(MLP.name, {keys.JOB_FIELD: b"y"})
        # mlp's read, still blocked from the first call, has it now.
        got = await asyncio.wait_for(streams.read([MLP, other], 10, block_ms), block_ms / 2000)
        assert [(e.stream, e.fields[keys.JOB_FIELD.encode()]) for e in got] == [(MLP, b"y")]
        assert streams.held(MLP) and streams.held(other)
        # other's read, sent again by the last call, gets z; closing waits for it, and
        # what it got stays pending for this consumer, read again at its next start.
        await client.xadd(other.name, {keys.JOB_FIELD: b"z"})
        await asyncio.wait_for(streams.aclose(), block_ms / 2000)
        restarted = StreamClient(client, "w1")
        got = await restarted.read([MLP, other], 10, None, pending=True)
        assert sorted(e.fields[keys.JOB_FIELD.encode()] for e in got) == [b"x", b"y", b"z"]
        # Without blocking: one round trip, each slot read.
        await client.xadd(MLP.name, {keys.JOB_FIELD: b"z1"})
        await client.xadd(other.name, {keys.JOB_FIELD: b"z2"})
        got = await restarted.read([MLP, other], 10, None)
        assert sorted(e.fields[keys.JOB_FIELD.encode()] for e in got) == [b"z1", b"z2"]
    finally:
        await streams.aclose()


async def test_cancel_flags_of_many_slots_in_one_call(client: aioredis.Redis) -> None:
    await client.set(keys.cancel_key("a"), 1)
    await client.set(keys.cancel_key("c"), 1)
    names = [keys.cancel_key(r) for r in "abcd"]
    assert len({key_slot(n.encode()) for n in names}) > 1
    assert await get_many(client, names) == [b"1", None, b"1", None]
    assert await StreamClient(client, "w").cancelled(list("abcd")) == {"a", "c"}


async def test_a_write_waits_for_a_replica_until_a_primary_has_none(
    client: aioredis.Redis, cluster: LocalCluster
) -> None:
    """WAIT 1 goes to the primary of each written slot, answered once its replica has the
    write; a primary whose replica is gone times out once, and is then not waited on."""
    other = other_model(cluster)
    async with client.pipeline(transaction=False) as pipe:
        pipe.xadd(MLP.name, {"f": "1"})
        pipe.xadd(other.name, {"f": "2"})
        names = [MLP.name, other.name, MLP.name]
        # As long as it takes (WAIT answers once the replica has it): a loaded machine may
        # pass the mesh's 250 ms, and then the reply says 0 replicas.
        assert len(wait_for_replicas(client, pipe, names, wait_ms=30_000)) == 2
        replies = await pipe.execute()
    assert replies[-2:] == [1, 1]  # each primary's replica acknowledged
    primary = cluster.primary_of(MLP.name)
    replica = cluster.replica_of(primary)
    with redis.Redis(host=replica.host, port=replica.port, single_connection_client=True) as r:
        r.execute_command("READONLY")  # a replica answers reads of its slots
        assert r.xlen(MLP.name) == 1  # on the replica when the call returned
    cluster.kill(replica)
    try:
        for expected in ([primary.address], []):  # timed out once, then left alone
            async with client.pipeline(transaction=False) as pipe:
                pipe.xadd(MLP.name, {"f": "3"})
                assert wait_for_replicas(client, pipe, [MLP.name]) == expected
            async with client.pipeline(transaction=False) as pipe:
                pipe.xadd(MLP.name, {"f": "3"})
                assert len(await execute_replicated(client, pipe, [MLP.name])) == 1
    finally:
        cluster.restart(replica)


async def test_a_script_a_node_lost_is_loaded_again(
    client: aioredis.Redis, cluster: LocalCluster
) -> None:
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    assert await run_script(client, script, [MLP.name + ":n"], []) == 1
    for node in cluster.live():
        node.client().script_flush()
    assert await run_script(client, script, [MLP.name + ":n"], []) == 2


async def test_a_slot_whose_node_is_away_holds_back_no_other(
    client: aioredis.Redis, cluster: LocalCluster
) -> None:
    """Reading two models' streams while one's primary is down (before its replica takes
    over): the other's entries come back, blocking or not; only a read of nothing but the
    lost slot fails."""
    other = other_model(cluster)
    streams = StreamClient(client, "w1")
    await streams.ensure_groups([MLP, other])
    await client.xadd(MLP.name, {keys.JOB_FIELD: b"a"})
    lost = cluster.primary_of(other.name)
    cluster.kill(lost)
    try:
        got = await streams.read([MLP, other], 10, None)
        assert [e.fields[keys.JOB_FIELD.encode()] for e in got] == [b"a"]
        await client.xadd(MLP.name, {keys.JOB_FIELD: b"b"})
        got = await asyncio.wait_for(streams.read([MLP, other], 10, 2_000), 5)
        assert [e.fields[keys.JOB_FIELD.encode()] for e in got] == [b"b"]
        with pytest.raises(STREAM_ERRORS):
            await streams.read([other], 10, None)
    finally:
        await streams.aclose()
        cluster.wait_ok()  # its replica took over
        cluster.restart(lost)
