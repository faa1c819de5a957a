"""The gateway's jobs reach the router in batches over one long-lived stream (a real router,
a real Redis, a real worker behind it): jobs queued together go out as one message, every job
gets its own outcome, and a router restarted under the stream is reached again."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from tests.grpc_server import serving
from tests.integration.conftest import InProcessMesh, start_mesh
from tests.polling import until
from tests.tenants import write_tenants
from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import Job, Timing
from tiermesh.core.server import make_channel
from tiermesh.core.settings import RouterSettings
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import job_to_proto
from tiermesh.gateway.upstream import RouterClient
from tiermesh.router.__main__ import serve as serve_router
from tiermesh.router.routing import Placed
from tiermesh.router.servicer import RouterServicer
from tiermesh.up.processes import free_port
from tiermesh.v1 import router_pb2, router_pb2_grpc

pytestmark = pytest.mark.integration


def job(model: str = "mlp", **fields: Any) -> Job:
    x = from_numpy("INPUT0", np.ones((1, 4), np.float32), "FP32")
    now = time.time_ns()
    base = Job(
        request_id=uuid.uuid4().hex,
        model=model,
        inputs=(x,),
        gateway="127.0.0.1:1",  # nobody waits for the results: only placement is tested
        deadline_ns=now + 10 * 10**9,
        timing=Timing(received_ns=now),
    )
    return dataclasses.replace(base, **fields)


async def test_jobs_queued_together_travel_as_one_batch_each_with_its_outcome(
    mesh: InProcessMesh,
) -> None:
    channel = make_channel(mesh.router)
    client = RouterClient(channel)
    try:
        jobs = [job() for _ in range(12)] + [job("no-such-model"), job(deadline_ns=1)]
        outcomes = await asyncio.gather(
            *(client.route(j, 10) for j in jobs), return_exceptions=True
        )
        # All fourteen were queued before the pump ran: one message carried them.
        assert (client.batches, client.jobs) == (1, 14)
        assert all(getattr(o, "version", None) == "1" for o in outcomes[:12]), outcomes
        unknown, late = outcomes[12:]
        assert isinstance(unknown, MeshError) and unknown.code == grpc.StatusCode.NOT_FOUND
        assert "Request for unknown model: 'no-such-model'" in unknown.message
        assert isinstance(late, MeshError) and late.code == grpc.StatusCode.DEADLINE_EXCEEDED
        # One job after another (each awaited): each goes out at once, alone.
        for _ in range(3):
            await client.route(job(), 10)
        assert (client.batches, client.jobs) == (4, 17)
    finally:
        await client.close()
        await channel.close()


async def test_a_restarted_router_is_reached_on_a_new_stream(
    redis_url: str, model_repo: Path
) -> None:
    mesh = await start_mesh(redis_url, model_repo)
    port = free_port()
    # A grace longer than the waits below: the router stops once its streams are answered
    # and ended (RouterServicer.drain), not when the grace runs out.
    settings = RouterSettings(
        redis_url=redis_url,
        model_repository=model_repo,
        router_port=port,
        metrics_port=0,
        shutdown_grace_s=120,
    )

    async def start() -> tuple[asyncio.Event, asyncio.Task[None]]:
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve_router(settings, stop, None, lambda _: ready.set()))
        await asyncio.wait_for(ready.wait(), 30)
        return stop, task

    stop, task = await start()
    channel = make_channel(f"127.0.0.1:{port}")
    client = RouterClient(channel)
    try:
        assert (await client.route(job(), 10)).version == "1"
        stop.set()
        await asyncio.wait_for(task, 30)
        with pytest.raises(MeshError) as refused:
            await client.route(job(), 10)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        stop, task = await start()

        async def placed() -> bool:
            # The channel redials with gRPC's backoff: until then a job fails fast.
            try:
                return (await client.route(job(), 10)).version == "1"
            except MeshError as err:
                assert err.code == grpc.StatusCode.UNAVAILABLE
                return False

        await until(placed, "a job placed by the restarted router", 30, 0.2)
    finally:
        await client.close()
        await channel.close()
        stop.set()
        await asyncio.wait_for(task, 30)
        await mesh.close()


class HeldRouter(router_pb2_grpc.RouterServicer):
    """A router that places every job and holds each batch's replies until `release`."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.release = asyncio.Event()

    async def RouteStream(self, request_iterator, context):  # type: ignore[no-untyped-def]
        async for batch in request_iterator:
            self.sizes.append(len(batch.jobs))
            await self.release.wait()
            yield router_pb2.RouteReplies(
                replies=[
                    router_pb2.RouteReply(request_id=j.request_id, entry_id=f"e-{j.request_id}")
                    for j in batch.jobs
                ]
            )


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldRouter, str]]:
    """A HeldRouter on a real grpc.aio server, and its address."""
    router = HeldRouter()
    async with serving(router_pb2_grpc.add_RouterServicer_to_server, router) as address:
        yield router, address


async def test_jobs_that_come_while_a_batch_is_out_go_as_the_next_one(
    held: tuple[HeldRouter, str],
) -> None:
    router, address = held
    channel = make_channel(address)
    client = RouterClient(channel)
    pump = client._pump
    try:
        jobs = [job() for _ in range(4)]
        first = asyncio.create_task(client.route(jobs[0], 10))
        await until(lambda: _true(router.sizes == [1]), "the first job at the router")
        # Three more, one at a time, each taken in by the pump (its wake consumed) before
        # the next is queued: written as they came, they would be three messages.
        later = []
        for j in jobs[1:]:
            later.append(asyncio.create_task(client.route(j, 10)))
            await until(
                lambda rid=j.request_id: _true(rid in client._waiting and not pump._wake.is_set()),
                "the job queued and the pump waiting again",
            )
        assert router.sizes == [1]
        router.release.set()
        placed = await asyncio.gather(first, *later)
        assert router.sizes == [1, 3]
        assert [p.entry_id for p in placed] == [f"e-{j.request_id}" for j in jobs]
        assert (client.batches, client.jobs) == (2, 4)
    finally:
        await client.close()
        await channel.close()


async def _true(value: bool) -> bool:
    return value


async def test_a_batch_holds_jobs_up_to_its_byte_limit_and_the_rest_goes_next(
    held: tuple[HeldRouter, str],
) -> None:
    router, address = held
    router.release.set()
    channel = make_channel(address)
    jobs = [job() for _ in range(5)]
    one = job_to_proto(jobs[0]).ByteSize()
    client = RouterClient(channel, max_batch_bytes=2 * one + one // 2)
    try:
        placed = await asyncio.gather(*(client.route(j, 10) for j in jobs))
        assert router.sizes == [2, 2, 1]
        assert [p.entry_id for p in placed] == [f"e-{j.request_id}" for j in jobs]
        # A job bigger than the limit still goes, alone.
        big = job(inputs=(from_numpy("INPUT0", np.ones((1, 4096), np.float32), "FP32"),))
        assert (await client.route(big, 10)).entry_id == f"e-{big.request_id}"
        assert router.sizes[-1] == 1
    finally:
        await client.close()
        await channel.close()


class PlacingRouter:
    """Stands in for BatchRouter: places every job of a batch on one stream."""

    async def route_batch(self, jobs: list[Job], received_ns: int = 0) -> list[Placed]:
        return [Placed("tm:mlp@1.fp32:q:center:p2:b0", f"e-{j.request_id}", "1") for j in jobs]


async def test_the_router_counts_the_batches_and_jobs_it_routed() -> None:
    servicer = RouterServicer(PlacingRouter())  # type: ignore[arg-type]
    async with serving(router_pb2_grpc.add_RouterServicer_to_server, servicer) as address:
        channel = make_channel(address)
        client = RouterClient(channel)
        try:
            await asyncio.gather(*(client.route(job(), 10) for _ in range(5)))
            await client.route(job(), 10)
        finally:
            await client.close()
            await channel.close()
    # What the stop line reports: five jobs queued together went as one batch, then one.
    assert (servicer.batches, servicer.jobs) == (2, 6)


async def test_without_internal_mtls_the_router_checks_each_jobs_tenant_and_tensors(
    mesh: InProcessMesh, redis_url: str, model_repo: Path, tmp_path: Path
) -> None:
    """A job forged by any process that reaches the router's port (no certificate vouches
    for it): an invented tenant, a tenant the model is not for, tensors the model does not
    take are refused; what a gateway would send is placed (for the mesh's worker)."""
    settings = RouterSettings(
        redis_url=redis_url,
        model_repository=model_repo,
        router_port=free_port(),
        metrics_port=0,
        tenants_file=write_tenants(tmp_path / "tenants.yaml"),
    )
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(serve_router(settings, stop, None, lambda _: ready.set()))
    await asyncio.wait_for(ready.wait(), 30)
    channel = make_channel(f"127.0.0.1:{settings.router_port}")
    client = RouterClient(channel)
    wrong = from_numpy("INPUT0", np.ones((1, 5), np.float32), "FP32")
    try:
        for forged, code, says in [
            (job(tenant="mallory"), "PERMISSION_DENIED", "no such tenant may"),
            (job(tenant="user"), "PERMISSION_DENIED", "no such tenant may"),  # simple only
            (job(tenant=""), "PERMISSION_DENIED", "no such tenant may"),
            (job(tenant="ops", inputs=(wrong,)), "INVALID_ARGUMENT", "dimension 1 is 5"),
            (job(tenant="ops", requested_outputs=("NOPE",)), "INVALID_ARGUMENT", "NOPE"),
        ]:
            with pytest.raises(MeshError) as refused:
                await client.route(forged, 10)
            assert refused.value.code.name == code, refused.value
            assert says in refused.value.message
        assert (await client.route(job(tenant="ops"), 10)).version == "1"
    finally:
        await client.close()
        await channel.close()
        stop.set()
        await asyncio.wait_for(task, 30)


async def test_a_router_without_tenants_takes_jobs_of_no_tenant_only(mesh: InProcessMesh) -> None:
    channel = make_channel(mesh.router)
    client = RouterClient(channel)
    try:
        with pytest.raises(MeshError) as refused:
            await client.route(job(tenant="invented"), 10)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert (await client.route(job(), 10)).version == "1"
    finally:
        await client.close()
        await channel.close()
