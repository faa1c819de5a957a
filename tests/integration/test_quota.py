"""Per-tenant quotas and the audit stream against a real redis-server: two gateway
"replicas" share one limit, the Lua script follows limits.py's arithmetic, in-flight entries
of a dead gateway expire, holds are released on every exit, Redis away fails closed."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tiermesh.core import keys
from tiermesh.core.errors import MeshError
from tiermesh.core.tenants import Tenant
from tiermesh.gateway.audit import AuditEntry, AuditLog
from tiermesh.gateway.auth import Tenants
from tiermesh.gateway.limits import TokenBucket, take
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.quota import IN_FLIGHT, RATE, Quota, QuotaRefused
from tiermesh.gateway.security import AccessGate, Security
from tiermesh.up.processes import free_port
from tiermesh.up.redis_server import start_redis

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000  # a realistic unix time in ms: 13 digits through Lua's numbers


def tenant(rate: float = 10.0, burst: int = 3, max_in_flight: int = 100) -> Tenant:
    return Tenant("acme", (b"\x00" * 32,), None, rate, burst, max_in_flight)


class Clock:
    def __init__(self, ms: int = T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
async def clients(redis_url: str) -> AsyncIterator[tuple[aioredis.Redis, aioredis.Redis]]:
    """Two clients, as two gateway replicas would have."""
    a, b = aioredis.Redis.from_url(redis_url), aioredis.Redis.from_url(redis_url)
    yield a, b
    await a.aclose()
    await b.aclose()


async def outcome(q: Quota, t: Tenant, rid: str, deadline_ms: int) -> int | str:
    """0 when admitted, else 'kind:retry-after'."""
    try:
        await q.acquire(t, rid, deadline_ms)
        return 0
    except QuotaRefused as err:
        assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        return f"{err.kind}:{err.retry_after_ms}"


async def test_two_replicas_share_one_rate_limit(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    clock = Clock()
    one, two = (Quota(c, 50, clock_ms=clock) for c in clients)
    t = tenant(rate=10, burst=3)
    got = [await outcome(q, t, f"r{i}", T0 + 60_000) for i, q in enumerate([one, two] * 2)]
    # A burst of 3 between both replicas, not 3 each; the next token is 100 ms away.
    assert got == [0, 0, 0, f"{RATE}:100"]
    clock.ms += 100
    assert await outcome(two, t, "r5", T0 + 60_000) == 0
    assert await outcome(one, t, "r6", T0 + 60_000) == f"{RATE}:100"


async def test_the_script_follows_the_reference_arithmetic(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    rng = random.Random(8)
    clock = Clock()
    replicas = [Quota(c, 50, clock_ms=clock) for c in clients]
    t = tenant(rate=7.5, burst=4, max_in_flight=10_000)  # never released here
    bucket: TokenBucket | None = None
    for i in range(300):
        clock.ms += rng.choice([0, 0, 1, 13, 50, 133, 400])
        expected = take(bucket, clock.ms, t.requests_per_s, t.burst)
        bucket = expected.bucket
        got = await outcome(rng.choice(replicas), t, f"r{i}", clock.ms + 60_000)
        assert got == (0 if expected.admitted else f"{RATE}:{expected.retry_after_ms}"), i


async def test_in_flight_cap_release_and_expiry_of_a_dead_gateways_entries(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    clock = Clock()
    one, two = (Quota(c, 25, clock_ms=clock) for c in clients)
    t = tenant(rate=1000, burst=1000, max_in_flight=2)
    held = await one.acquire(t, "a", T0 + 1000)
    await two.acquire(t, "b", T0 + 5000)  # "two" then dies without releasing
    assert await outcome(one, t, "c", T0 + 1000) == f"{IN_FLIGHT}:25"
    await one.release(held)
    assert await one.in_flight("acme") == 1
    assert await outcome(one, t, "c", T0 + 1000) == 0
    assert await outcome(one, t, "d", T0 + 1000) == f"{IN_FLIGHT}:25"
    # Past b's deadline its entry no longer counts, though nobody released it.
    clock.ms = T0 + 5000
    assert await outcome(one, t, "e", T0 + 9000) == 0
    assert await one.in_flight("acme") == 1


async def test_keys_expire_by_themselves(clients: tuple[aioredis.Redis, aioredis.Redis]) -> None:
    redis, _ = clients
    q = Quota(redis, 25, clock_ms=Clock())
    await q.acquire(tenant(rate=2, burst=4), "a", T0 + 3000)
    bucket_ttl = await redis.pttl(keys.quota_rate_key("acme"))
    in_flight_ttl = await redis.pttl(keys.quota_in_flight_key("acme"))
    # Full again after 4 / 2 = 2 s: the bucket may be forgotten then (plus a margin).
    assert 2000 < bucket_ttl <= 3000
    assert 3000 < in_flight_ttl <= 4000


async def test_redis_time_is_the_clock_when_none_is_injected(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    q = Quota(clients[0], 25)
    t = tenant(rate=0.001, burst=2)
    now_ms = int((await clients[0].time())[0]) * 1000
    far = now_ms + 600_000
    assert [await outcome(q, t, r, far) for r in "abc"][:2] == [0, 0]
    assert str(await outcome(q, t, "d", far)).startswith(f"{RATE}:")


async def test_redis_away_fails_closed_with_unavailable() -> None:
    down = aioredis.Redis(
        host="127.0.0.1", port=free_port(), socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    try:
        with pytest.raises(MeshError) as err:
            await Quota(down, 25).acquire(tenant(), "a", T0)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert not isinstance(err.value, QuotaRefused)
    finally:
        await down.aclose()


async def test_gate_releases_on_error_and_on_cancellation(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    redis, _ = clients
    quota = Quota(redis, 25)
    metrics = GatewayMetrics(CollectorRegistry())
    gate = AccessGate(Security(Tenants([]), quota, AuditLog(redis, 100)), metrics)
    t = tenant(max_in_flight=1)
    far = int((await redis.time())[0]) * 1000 + 600_000

    with pytest.raises(RuntimeError):
        async with gate.hold(t, "a", far * 1_000_000):
            assert await quota.in_flight("acme") == 1
            raise RuntimeError("the call failed")
    assert await quota.in_flight("acme") == 0

    inside = asyncio.Event()

    async def call() -> None:
        async with gate.hold(t, "b", far * 1_000_000):
            inside.set()
            await asyncio.Event().wait()  # the caller goes away meanwhile

    task = asyncio.create_task(call())
    await asyncio.wait_for(inside.wait(), 10)
    with pytest.raises(MeshError):  # the cap is reached while b is held
        async with gate.hold(t, "c", far * 1_000_000):
            pass
    assert metrics.quota_refusals.labels(tenant="acme", kind=IN_FLIGHT)._value.get() == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await quota.in_flight("acme") == 0


def entry(i: int, tenant: str = "acme") -> AuditEntry:
    return AuditEntry(
        time_ms=T0 + i,
        tenant=tenant,
        model="mlp",
        variant="fp32",
        outcome="OK",
        request_id=f"req{i}",
        peer="ipv4:127.0.0.1:5555",
        duration_ms=1.25,
    )


async def test_audit_entries_are_written_in_order_and_trimmed(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    redis, _ = clients
    log = AuditLog(redis, max_len=10)
    log.record(entry(0, tenant=""))
    await log.flush()
    ((_, first),) = await redis.xrange(keys.AUDIT_STREAM)
    assert {k.decode(): v.decode() for k, v in first.items()} == {
        "time_ms": str(T0),
        "operation": "infer",
        "tenant": "-",
        "model": "mlp",
        "variant": "fp32",
        "outcome": "OK",
        "request_id": "req0",
        "peer": "ipv4:127.0.0.1:5555",
        "duration_ms": "1.250",
    }
    for i in range(1, 1000):
        log.record(entry(i))
    await log.flush()
    assert log.written == 1000 and log.lost == 0
    # Approximate MAXLEN: trimmed to about the bound (whole macro nodes), never unbounded.
    length = await redis.xlen(keys.AUDIT_STREAM)
    assert 10 <= length < 1000
    last = (await redis.xrevrange(keys.AUDIT_STREAM, count=1))[0][1]
    assert last[b"request_id"] == b"req999"


async def test_audit_writer_task_flushes_what_is_recorded(
    clients: tuple[aioredis.Redis, aioredis.Redis],
) -> None:
    redis, _ = clients
    log = AuditLog(redis, max_len=100)
    writer = asyncio.create_task(log.run())
    try:
        log.record(entry(1))
        log.record(entry(2))
        deadline = asyncio.get_running_loop().time() + 10
        while await redis.xlen(keys.AUDIT_STREAM) < 2:
            assert asyncio.get_running_loop().time() < deadline, "writer never flushed"
            await asyncio.sleep(0.01)
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)


async def test_audit_entries_wait_out_a_redis_outage_and_calls_are_refused_when_full(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there yet: Redis is away
    down = aioredis.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=1.0, retry=Retry(NoBackoff(), 0)
    )
    lost: list[int] = []
    log = AuditLog(down, max_len=100, on_lost=lost.append, max_queued=2)
    gate = AccessGate(
        Security(Tenants([]), Quota(down, 25), log), GatewayMetrics(CollectorRegistry())
    )
    server = None
    try:
        log.record(entry(0))
        assert not await log.flush()  # kept, not lost
        gate.check_audit_room()  # one waits: room for another call
        log.record(entry(1))
        with pytest.raises(MeshError) as err:
            gate.check_audit_room()
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert err.value.retry_after_ms == 1000
        log.record(entry(2))  # a call under way when it filled: the one entry lost
        assert lost == [1] and log.lost == 1
        server = start_redis(port, tmp_path / "redis")
        assert await log.flush()
        assert log.written == 2 and log.has_room
        ids = [f[b"request_id"] for _, f in await down.xrange(keys.AUDIT_STREAM)]
        assert ids == [b"req0", b"req1"]
    finally:
        await down.aclose()
        if server is not None:
            server.terminate()
            server.wait(timeout=10)
