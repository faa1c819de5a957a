"""The four services in this process, on port 0, against the real redis-server, every
span captured in memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.conftest import door_cache
from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.message_bytes import MAX_MESSAGE_BYTES
from tiermesh.core.output_steps import OutputSteps
from tiermesh.core.server import make_server
from tiermesh.core.settings import (
    GatewaySettings,
    PostprocessSettings,
    RouterSettings,
    WorkerSettings,
)
from tiermesh.core.telemetry import Telemetry
from tiermesh.frontdoor.build import build
from tiermesh.gateway.__main__ import serve as serve_gateway
from tiermesh.gateway.delivery import DeliveryServicer
from tiermesh.gateway.pending import PendingRequests
from tiermesh.postprocess.__main__ import serve as serve_postprocess
from tiermesh.postprocess.servicer import PostprocessServicer
from tiermesh.router.__main__ import serve as serve_router
from tiermesh.v1 import delivery_pb2_grpc, postprocess_pb2_grpc
from tiermesh.worker.__main__ import serve as serve_worker


@pytest.fixture(scope="session")
def door_binary(tmp_path_factory: pytest.TempPathFactory, go_build_cache: Path) -> Path:
    """The Go front door, built once for the tests that run its subcommands (needs_go)."""
    return build(door_cache(tmp_path_factory.mktemp("frontdoor-cache"), go_build_cache))


def door_answers(door: Path, args: list[str], lines: list[Any]) -> list[Any]:
    """One of the door's subcommands (`frontdoor tokenize PLAN`, `frontdoor place PLAN`) over
    the lines, each given as JSON: its answer to each, read from JSON."""
    done = subprocess.run(
        [str(door), *args],
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    answers = [json.loads(answer) for answer in done.stdout.splitlines()]
    assert len(answers) == len(lines), done.stderr
    return answers


@dataclass
class InProcessMesh:
    gateway: str
    exporter: InMemorySpanExporter
    # The router's address (a test may start more gateways on it).
    router: str = ""
    # What each service reported when ready (its ports), by name.
    ports: dict[str, dict[str, int]] = field(default_factory=dict)
    stops: list[tuple[asyncio.Event, asyncio.Task[None]]] = field(default_factory=list)

    async def close(self) -> None:
        """Stop in drain order (gateway first), awaiting each service's task."""
        for stop, task in reversed(self.stops):
            stop.set()
            await asyncio.wait_for(task, 30)


ServeFn = Callable[..., Awaitable[None]]


async def _start(
    mesh: InProcessMesh, name: str, serve: ServeFn, settings: Any, exporter: InMemorySpanExporter
) -> dict[str, int]:
    telemetry = Telemetry(name)
    telemetry.provider.add_span_processor(SimpleSpanProcessor(exporter))
    ready: asyncio.Future[dict[str, int]] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop, telemetry, ready.set_result), name=name)
    mesh.stops.append((stop, task))
    done, _ = await asyncio.wait({ready, task}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises what made it exit
    assert ready in done, f"{name} did not become ready"
    mesh.ports[name] = ready.result()
    return ready.result()


async def start_mesh(
    redis_url: str,
    repo: Path,
    *,
    common_overrides: dict[str, Any] | None = None,
    gateway_overrides: dict[str, Any] | None = None,
    **worker_overrides: Any,
) -> InProcessMesh:
    """The four services in this process; `common_overrides` go to every service's
    settings, `gateway_overrides` to the gateway's (its tenants file to the router's too,
    as `tiermesh up` gives it: without internal mTLS the router checks jobs' tenants), the
    rest to the worker's."""
    exporter = InMemorySpanExporter()
    mesh = InProcessMesh(gateway="", exporter=exporter)
    common = {
        "redis_url": redis_url,
        "model_repository": repo,
        "shutdown_grace_s": 5,
        "metrics_port": 0,
        **(common_overrides or {}),
    }
    try:
        post = await _start(
            mesh,
            "postprocess",
            serve_postprocess,
            PostprocessSettings(**common, postprocess_port=0),
            exporter,
        )
        tenants = {k: v for k, v in (gateway_overrides or {}).items() if k == "tenants_file"}
        router = await _start(
            mesh,
            "router",
            serve_router,
            RouterSettings(**common, **tenants, router_port=0),
            exporter,
        )
        await _start(
            mesh,
            "worker",
            serve_worker,
            WorkerSettings(
                **common,
                worker_health_port=0,
                postprocess_address=f"127.0.0.1:{post['port']}",
                **worker_overrides,
            ),
            exporter,
        )
        gw = await _start(
            mesh,
            "gateway",
            serve_gateway,
            GatewaySettings(
                **common,
                gateway_port=0,
                delivery_port=0,
                # Never the fixed default (8000): tests and meshes run side by side.
                http_port=0,
                router_address=f"127.0.0.1:{router['port']}",
                **(gateway_overrides or {}),
            ),
            exporter,
        )
    except BaseException:
        await mesh.close()
        raise
    mesh.gateway = f"127.0.0.1:{gw['port']}"
    mesh.router = f"127.0.0.1:{router['port']}"
    return mesh


@pytest.fixture
async def mesh(redis_url: str, model_repo: Path) -> AsyncIterator[InProcessMesh]:
    m = await start_mesh(redis_url, model_repo)
    try:
        yield m
    finally:
        await m.close()


@dataclass
class Downstream:
    pending: PendingRequests
    delivery_address: str
    postprocess_address: str


@contextlib.asynccontextmanager
async def serve_downstream(
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    delivery_servicer: Callable[[PendingRequests], DeliveryServicer] = DeliveryServicer,
) -> AsyncIterator[Downstream]:
    """A real postprocess server delivering to a real Delivery server (`delivery_servicer`
    of the waiting requests), both on port 0, with `max_message_bytes` as the message limit
    of both servers and of postprocess's deliveries."""
    telemetry = Telemetry("test")
    pending = PendingRequests()
    delivery = make_server(telemetry, max_message_bytes)
    delivery_pb2_grpc.add_DeliveryServicer_to_server(delivery_servicer(pending), delivery)
    dport = delivery.add_insecure_port("127.0.0.1:0")
    gateways = GatewayClients(5, max_message_bytes=max_message_bytes)
    post = make_server(telemetry, max_message_bytes)
    postprocess_pb2_grpc.add_PostprocessServicer_to_server(
        PostprocessServicer(OutputSteps(), gateways), post
    )
    pport = post.add_insecure_port("127.0.0.1:0")
    await delivery.start()
    await post.start()
    try:
        yield Downstream(pending, f"127.0.0.1:{dport}", f"127.0.0.1:{pport}")
    finally:
        await post.stop(None)
        await delivery.stop(None)
        await gateways.close()


@pytest.fixture
async def downstream() -> AsyncIterator[Downstream]:
    """A real postprocess server delivering to a real Delivery server, both on port 0."""
    async with serve_downstream() as down:
        yield down
