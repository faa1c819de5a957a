"""Batch jobs under the same limits as online work, against the real redis-server and the
BatchJobs servicer on a real grpc.aio server (port 0), over the gateway's data plane and
gate as __main__ builds them: a Submit takes a rate-limit token and an in-flight slot; the
open-jobs, inputs and bytes caps refuse RESOURCE_EXHAUSTED naming the cap and store nothing
past it; texts are validated as ModelInfer validates them; a Submit that does not end well
leaves nothing, and every key a job writes has a TTL from its first write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from tests.conftest import MODELS
from tests.integration.conftest import start_mesh
from tests.polling import until
from tiermesh.batch.limits import BatchCaps
from tiermesh.batch.store import BatchStore
from tiermesh.core import keys
from tiermesh.core.errors import RETRY_AFTER_KEY
from tiermesh.core.repository import ModelRepository
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.tenants import hash_key, new_key, parse_tenants
from tiermesh.core.tensors import join_bytes
from tiermesh.gateway.audit import AuditLog
from tiermesh.gateway.auth import Tenants
from tiermesh.gateway.batch_jobs import BatchJobsServicer
from tiermesh.gateway.control import ModelControl
from tiermesh.gateway.decoding import add_public_servicer
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PendingRequests
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.quota import Quota
from tiermesh.gateway.security import AccessGate, Security
from tiermesh.gateway.upstream import Cancellations, Liveness, RouterClient, Upstream
from tiermesh.v1 import batch_pb2, batch_pb2_grpc, tensor_pb2

pytestmark = pytest.mark.integration

KEY = new_key()
AUTH = (("authorization", f"Bearer {KEY}"),)
# The one key pattern of a job's own keys (record, inputs, results: one hash tag per job).
JOB_KEYS = "tm:{batch}:job:*"


def tenants_yaml(extra: str = "", rate: str = "{requests_per_s: 1000, burst: 1000}") -> str:
    return (
        "tenants:\n"
        "  - name: acme\n"
        f"    key_sha256: [{hash_key(KEY).hex()}]\n"
        '    models: "*"\n'
        f"    rate: {rate}\n"
        "    max_in_flight: 8\n"
        f"{extra}"
    )


@dataclass
class Door:
    """The batch-jobs door of a gateway: its address and the gateway's Redis."""

    stub: batch_pb2_grpc.BatchJobsStub
    redis: aioredis.Redis
    registry: CollectorRegistry
    audit: AuditLog | None = None


# Opens a door: (tenants file text or None, caps, submit timeout s).
OpenDoor = Callable[..., Awaitable[Door]]


@pytest.fixture
async def door_factory(redis_url: str, fetched_models: tuple[str, ...]) -> AsyncIterator[OpenDoor]:
    """Opens doors as the gateway's __main__ builds them (the committed models, minilm-l6
    among them for its text limit); closes them all after the test."""
    closing: list[tuple[grpc.aio.Server, grpc.aio.Channel, aioredis.Redis]] = []

    async def open_door(
        tenants: str | None,
        caps: BatchCaps | None = None,
        submit_timeout_s: float = 600.0,
    ) -> Door:
        redis = aioredis.Redis.from_url(redis_url)
        repo = ModelRepository(MODELS)
        repo.load()
        registry = CollectorRegistry()
        metrics = GatewayMetrics(registry)
        security = None
        if tenants is not None:
            quota = Quota(redis, 100)
            security = Security(Tenants(parse_tenants(tenants)), quota, AuditLog(redis, 100))
        gate = AccessGate(security, metrics)
        liveness = Liveness(redis)
        # The router is never called by the batch door (the feeder queues its work).
        upstream = Upstream(
            RouterClient(grpc.aio.insecure_channel("127.0.0.1:1")),
            liveness,
            Cancellations(redis),
        )
        plane = DataPlane(
            GatewaySettings(model_repository=MODELS, redis_url=redis_url),
            repo,
            upstream,
            PendingRequests(),
            "127.0.0.1:1",
            metrics,
            gate,
            control=ModelControl(redis, repo, liveness),
            control_enabled=False,
        )
        servicer = BatchJobsServicer(
            plane, BatchStore(redis), gate=gate, caps=caps, submit_timeout_s=submit_timeout_s
        )
        server = grpc.aio.server()
        add_public_servicer(
            batch_pb2_grpc.add_BatchJobsServicer_to_server, servicer, server, None, 16 << 20
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        closing.append((server, channel, redis))
        audit = security.audit if security is not None else None
        return Door(batch_pb2_grpc.BatchJobsStub(channel), redis, registry, audit)

    yield open_door
    for server, channel, redis in closing:
        await channel.close()
        await server.stop(None)
        await redis.aclose()


def _texts(n: int, start: int = 0) -> list[str]:
    return [f"text {i}" for i in range(start, start + n)]


async def _submit(
    door: Door, chunks: Iterable[batch_pb2.SubmitChunk], auth: bool = True
) -> batch_pb2.BatchJob:
    async def stream() -> AsyncIterator[batch_pb2.SubmitChunk]:
        for c in chunks:
            yield c

    reply: batch_pb2.BatchJob = await door.stub.Submit(stream(), metadata=AUTH if auth else ())
    return reply


async def _refused(door: Door, chunks: Iterable[batch_pb2.SubmitChunk]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _submit(door, chunks)
    return err.value


async def _job_keys(redis: aioredis.Redis) -> list[bytes]:
    return sorted([k async for k in redis.scan_iter(match=JOB_KEYS)])


async def _unbounded(redis: aioredis.Redis) -> list[bytes]:
    """Every key (SCAN) without a TTL."""
    return [k async for k in redis.scan_iter() if await redis.ttl(k) == -1]


@asynccontextmanager
async def _list_events(redis: aioredis.Redis) -> AsyncIterator[aioredis.client.PubSub]:
    """Keyspace events of list pushes and deletes, in the order Redis made them, from
    the moment this enters (both subscriptions confirmed) until it leaves."""
    await redis.config_set("notify-keyspace-events", "Elg")
    pubsub = redis.pubsub()
    try:
        await pubsub.psubscribe("__keyevent@0__:rpush", "__keyevent@0__:del")
        confirmed: list[object] = []

        async def subscribed() -> bool:
            msg = await pubsub.get_message(timeout=0.05)
            if msg is not None and msg["type"] == "psubscribe":
                confirmed.append(msg)
            return len(confirmed) == 2

        await until(subscribed, "the keyspace subscriptions", 10)
        yield pubsub
    finally:
        await pubsub.aclose()
        await redis.config_set("notify-keyspace-events", "")


async def _events_until_del(pubsub: aioredis.client.PubSub) -> list[str]:
    """'event key' of each list push and delete until the first delete of inputs."""
    events: list[str] = []

    async def deleted() -> bool:
        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if msg is not None:
            event = msg["channel"].decode().rsplit(":", 1)[1]
            events.append(f"{event} {msg['data'].decode()}")
        return any(e.startswith("del ") and e.endswith(":in") for e in events)

    await until(deleted, "the refused job's inputs to be deleted", 10)
    return events


async def test_a_submit_takes_a_rate_limit_token_valid_or_not(door_factory: OpenDoor) -> None:
    door = await door_factory(tenants_yaml(rate="{requests_per_s: 0.01, burst: 2}"))
    # One refused for its text still spends its token, as ModelInfer's invalid calls do.
    bad = await _refused(door, [batch_pb2.SubmitChunk(model="minilm-l6", texts=["x" * 20_000])])
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    job = await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(3))])
    assert (job.status, job.total, job.tenant) == ("queued", 3, "acme")
    limited = await _refused(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(3))])
    assert limited.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert limited.details() == "tenant 'acme' is over its rate limit; retry later"
    assert dict(limited.trailing_metadata() or ())[RETRY_AFTER_KEY]  # type: ignore[arg-type]
    labels = {"tenant": "acme", "kind": "rate"}
    assert door.registry.get_sample_value("tiermesh_quota_refusals_total", labels) == 1
    # The bucket is the one online calls use; the in-flight slots were given back.
    tokens = await door.redis.hget(keys.quota_rate_key("acme"), "tokens")
    assert tokens is not None and float(tokens) < 1
    assert await door.redis.zcard(keys.quota_in_flight_key("acme")) == 0
    # Nothing of the refused Submit was stored: one job (the accepted one) exists.
    assert await _job_keys(door.redis) == sorted(
        [keys.batch_job_key(job.job_id).encode(), keys.batch_inputs_key(job.job_id).encode()]
    )


async def test_batch_job_calls_leave_audit_entries(door_factory: OpenDoor) -> None:
    door = await door_factory(tenants_yaml())
    job = await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))])
    await door.stub.Status(batch_pb2.JobRef(job_id=job.job_id), metadata=AUTH)
    with pytest.raises(grpc.aio.AioRpcError):
        await door.stub.Cancel(batch_pb2.JobRef(job_id="no-such-job"), metadata=())
    assert door.audit is not None
    assert await door.audit.flush()
    entries = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in await door.redis.xrange(keys.AUDIT_STREAM)
    ]
    seen = [
        (e["operation"], e["tenant"], e["model"], e["outcome"], e["request_id"]) for e in entries
    ]
    assert seen == [
        ("batch.submit", "acme", "echo", "OK", ""),
        ("batch.status", "acme", "", "OK", job.job_id),
        ("batch.cancel", "-", "", "UNAUTHENTICATED", "no-such-job"),
    ]


async def test_a_submit_holds_an_in_flight_slot_while_its_inputs_arrive(
    door_factory: OpenDoor,
) -> None:
    door = await door_factory(tenants_yaml().replace("max_in_flight: 8", "max_in_flight: 1"))
    more = asyncio.Event()

    async def slow() -> AsyncIterator[batch_pb2.SubmitChunk]:
        yield batch_pb2.SubmitChunk(model="echo", texts=_texts(2))
        await more.wait()
        yield batch_pb2.SubmitChunk(texts=_texts(2, 2))

    first = door.stub.Submit(slow(), metadata=AUTH)

    async def held() -> bool:
        return bool(await door.redis.zcard(keys.quota_in_flight_key("acme")) == 1)

    await until(held, "the first Submit to hold its slot")
    second = await _refused(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(1))])
    assert second.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "in-flight cap" in (second.details() or "")
    more.set()
    job = await first
    assert job.total == 4
    assert await door.redis.zcard(keys.quota_in_flight_key("acme")) == 0


async def test_the_open_jobs_cap_refuses_the_next_job_until_one_ends(
    door_factory: OpenDoor,
) -> None:
    door = await door_factory(tenants_yaml("    batch: {max_open_jobs: 2}\n"))
    jobs = [await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))])]
    jobs.append(await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))]))
    stored = await _job_keys(door.redis)
    err = await _refused(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == (
        "tenant 'acme' has 2 unfinished batch jobs, its cap (max_open_jobs); submit again "
        "once one has ended"
    )
    assert dict(err.trailing_metadata() or ())[RETRY_AFTER_KEY] == "1000"  # type: ignore[arg-type]
    assert await _job_keys(door.redis) == stored  # no record, no input of a third job
    # Once one has ended (cancelled here), the next job is taken.
    await door.stub.Cancel(batch_pb2.JobRef(job_id=jobs[0].job_id), metadata=AUTH)
    third = await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))])
    assert third.status == "queued"
    open_ids = await door.redis.smembers(keys.batch_open_key("acme"))
    assert open_ids == {jobs[1].job_id.encode(), third.job_id.encode()}


async def test_without_a_tenants_file_the_defaults_cap_the_one_anonymous_tenant(
    door_factory: OpenDoor,
) -> None:
    door = await door_factory(None, BatchCaps(max_open_jobs=1))
    job = await _submit(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))], auth=False)
    assert job.tenant == ""
    err = await _refused(door, [batch_pb2.SubmitChunk(model="echo", texts=_texts(2))])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details().startswith("this port's caller has 1 unfinished batch jobs")
    assert 0 < await door.redis.ttl(keys.batch_open_key(""))


@pytest.mark.parametrize(
    ("caps", "cap_name"),
    [
        (BatchCaps(max_inputs=10), "cap of 10 inputs (max_inputs)"),
        (BatchCaps(max_bytes=400), "cap of 400 bytes (max_bytes)"),
    ],
)
async def test_a_job_over_its_cap_is_refused_before_the_crossing_chunk_is_stored(
    door_factory: OpenDoor, caps: BatchCaps, cap_name: str
) -> None:
    """4 + 4 inputs (39 bytes each, as stored) are stored; the third chunk of 4 crosses the cap:
    refused naming it, with no third push, and then the whole job is deleted."""
    door = await door_factory(tenants_yaml(), caps)
    async with _list_events(door.redis) as pubsub:
        err = await _refused(
            door,
            [
                batch_pb2.SubmitChunk(model="echo", texts=_texts(4)),
                batch_pb2.SubmitChunk(texts=_texts(4, 4)),
                batch_pb2.SubmitChunk(texts=_texts(4, 8)),
            ],
        )
        seen = await _events_until_del(pubsub)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cap_name in (err.details() or "")
    assert RETRY_AFTER_KEY not in dict(err.trailing_metadata() or ())  # type: ignore[arg-type]
    # Two pushes (chunks 1 and 2) of one job's inputs, then the delete of the refused job.
    inputs = [e.split()[1] for e in seen if e.endswith(":in")]
    assert [e.split()[0] for e in seen if e.endswith(":in")] == ["rpush", "rpush", "del"]
    assert len(set(inputs)) == 1
    assert await _job_keys(door.redis) == []
    assert await door.redis.scard(keys.batch_open_key("acme")) == 0


async def test_texts_are_validated_as_modelinfer_validates_them(door_factory: OpenDoor) -> None:
    """minilm-l6's max_text_bytes (16384) holds for a job's texts in any chunk, and tensor
    inputs are checked for UTF-8; a refused job leaves nothing."""
    door = await door_factory(tenants_yaml())
    at_limit = await _submit(door, [batch_pb2.SubmitChunk(model="minilm-l6", texts=["é" * 8192])])
    assert at_limit.total == 1
    stored = await _job_keys(door.redis)
    over = await _refused(
        door,
        [
            batch_pb2.SubmitChunk(model="minilm-l6", texts=["short"]),
            batch_pb2.SubmitChunk(texts=["x" * 16_385]),
        ],
    )
    assert over.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert over.details() == (
        "input 'text': text element 0 is 16385 bytes, over the limit of 16384"
    )
    bad_utf8 = tensor_pb2.Tensor(
        name="TEXT", datatype="BYTES", shape=[1, 1], raw=join_bytes([b"\xff\xfe"])
    )
    chunk = batch_pb2.SubmitChunk(model="echo")
    chunk.items.add().inputs.append(bad_utf8)
    err = await _refused(door, [chunk])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not valid UTF-8" in (err.details() or "")
    assert await _job_keys(door.redis) == stored


async def test_a_cancelled_submit_leaves_no_key_without_a_ttl(door_factory: OpenDoor) -> None:
    """2,000 inputs stored, then the client leaves: while loading every key of the job
    already expires; after the cancel the job is deleted and no key lacks a TTL."""
    door = await door_factory(tenants_yaml())
    never = asyncio.Event()

    async def leaving() -> AsyncIterator[batch_pb2.SubmitChunk]:
        yield batch_pb2.SubmitChunk(model="echo", texts=_texts(1000))
        yield batch_pb2.SubmitChunk(texts=_texts(1000, 1000))
        await never.wait()

    call = door.stub.Submit(leaving(), metadata=AUTH)

    async def all_stored() -> bool:
        found = [k async for k in door.redis.scan_iter(match="tm:{batch}:job:*:in")]
        return len(found) == 1 and await door.redis.llen(found[0]) == 2000

    await until(all_stored, "2,000 inputs to be stored")
    loading = await _job_keys(door.redis)
    assert len(loading) == 2
    # A loading job's keys expire a minute after its Submit's timeout (600 s here).
    for key in loading:
        assert 600 < await door.redis.ttl(key) <= 660, key
    assert await _unbounded(door.redis) == []
    call.cancel()

    async def deleted() -> bool:
        return await _job_keys(door.redis) == []

    await until(deleted, "the cancelled Submit's job to be deleted")
    assert await door.redis.scard(keys.batch_open_key("acme")) == 0
    assert await door.redis.zcard(keys.quota_in_flight_key("acme")) == 0
    assert await _unbounded(door.redis) == []


async def test_a_submit_past_its_timeout_ends_and_leaves_nothing(door_factory: OpenDoor) -> None:
    door = await door_factory(tenants_yaml(), submit_timeout_s=0.5)
    never = asyncio.Event()

    async def stalled() -> AsyncIterator[batch_pb2.SubmitChunk]:
        yield batch_pb2.SubmitChunk(model="echo", texts=_texts(10))
        await never.wait()

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await door.stub.Submit(stalled(), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.value.details() == "a batch job's inputs must all arrive within 0.5 s"
    assert await _job_keys(door.redis) == []


@pytest.mark.slow
async def test_a_running_job_keys_expire_and_an_expired_job_is_forgotten(
    redis_url: str, model_repo: Path
) -> None:
    """On the whole in-process mesh: while a job runs, every key it wrote (results from the
    first one on) has a TTL; the active set (bounded by the open-jobs caps) is the only key
    without one, and a job whose record expired is dropped from it by the feeder."""
    mesh = await start_mesh(redis_url, model_repo, common_overrides={"batch_max_queued": 40})
    redis = aioredis.Redis.from_url(redis_url)
    try:
        async with grpc.aio.insecure_channel(mesh.gateway) as channel:
            stub = batch_pb2_grpc.BatchJobsStub(channel)

            async def chunks() -> AsyncIterator[batch_pb2.SubmitChunk]:
                yield batch_pb2.SubmitChunk(model="echo", texts=_texts(3000))

            job = await stub.Submit(chunks())
            ref = batch_pb2.JobRef(job_id=job.job_id)

            async def running() -> bool:
                return bool((await stub.Status(ref)).done > 0)

            await until(running, "the first results", 30)
            batch_keys = [k async for k in redis.scan_iter(match="tm:{batch}:*")]
            assert keys.batch_results_key(job.job_id).encode() in batch_keys
            assert [k for k in batch_keys if await redis.ttl(k) == -1] == [
                keys.BATCH_ACTIVE.encode()
            ]
            await stub.Cancel(ref)
        # A job id whose record is gone (expired) is forgotten by the feeder's next round.
        await redis.sadd(keys.BATCH_ACTIVE, "expired-job")

        async def forgotten() -> bool:
            return not await redis.sismember(keys.BATCH_ACTIVE, "expired-job")

        await until(forgotten, "the feeder to drop the expired job", 10)
    finally:
        await redis.aclose()
        await mesh.close()
