"""The lifecycle every service shares (core/service.py): the Service with injected tasks on
real grpc.aio servers, then the same two-stage stop in the four real services."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from tests.integration.conftest import start_mesh
from tests.polling import until
from tiermesh.core import service as service_module
from tiermesh.core.service import Service
from tiermesh.core.settings import ServiceSettings
from tiermesh.core.telemetry import Telemetry

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _status(port: int) -> Any:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )
        return reply.status


async def _true(value: bool) -> bool:
    return value


class Loop:
    """A periodic task that counts its rounds and says what happened to it."""

    def __init__(self, events: list[str], name: str, fail: bool = False) -> None:
        self.events = events
        self.name = name
        self.fail = fail
        self.rounds = 0
        self.running = asyncio.Event()

    async def run(self, interval_s: float) -> None:
        self.running.set()
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        try:
            while True:
                self.rounds += 1
                await asyncio.sleep(interval_s)
        except asyncio.CancelledError:
            self.events.append(f"{self.name} cancelled")
            raise


class FlushedLoop(Loop):
    async def flush(self) -> None:
        self.events.append(f"{self.name} flushed")


def _service(grace_s: float = 5) -> Service:
    settings = ServiceSettings(shutdown_grace_s=grace_s, health_port=0)
    return Service("test", settings, Telemetry("lifecycle-test"))


def _closer(events: list[str], name: str) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        events.append(f"{name} closed")

    return close


async def test_the_stop_stops_intake_drains_then_cancels_flushes_and_closes_in_order() -> None:
    events: list[str] = []
    service = _service()
    public = grpc.aio.server()
    internal = grpc.aio.server()
    async with service:
        service.closing(_closer(events, "redis"))
        service.closing(lambda: events.append("metrics closed"))  # a plain call too
        internal_port = service.server(internal, "127.0.0.1", 0, grace_s=0, intake=False)
        public_port = service.server(
            public, "127.0.0.1", 0, grace_s=0, before_stop=(lambda: events.append("public next"),)
        )
        await service.start()
        assert await _status(service.probe_port) == NOT_SERVING  # until it says so
        await service.serving(None, {})
        assert await _status(service.probe_port) == SERVING
        loops = [FlushedLoop(events, "audit"), Loop(events, "control")]
        for loop in loops:
            service.periodic(loop.name, loop, 0.01)
        await until(
            lambda: _true(all(loop.running.is_set() for loop in loops)), "the loops running"
        )

        async def drain() -> None:
            # Intake stopped before the drain: the probe and the intake port say so, the
            # internal port still serves (deliveries arrive while a gateway drains).
            assert await _status(service.probe_port) == NOT_SERVING
            assert await _status(public_port) == NOT_SERVING
            assert await _status(internal_port) == SERVING
            events.append("drained")

        service.on_drain(drain)
        service.counters(lambda: {"rounds": sum(loop.rounds for loop in loops)})
        with capture_logs() as logs:
            await service.stop()
    assert events == [
        "drained",
        "public next",  # the last registered server stops first
        "audit cancelled",
        "audit flushed",
        "control cancelled",
        "metrics closed",  # in reverse order of registration
        "redis closed",
    ]
    stopped = [e for e in logs if e["event"] == "test stopped"]
    assert len(stopped) == 1 and stopped[0]["rounds"] >= 2
    # The `async with` exit stopped it again: nothing more happened.
    assert len(events) == 7
    with pytest.raises(grpc.aio.AioRpcError):
        await _status(public_port)


async def test_a_failing_periodic_task_is_logged_and_the_others_are_still_stopped() -> None:
    events: list[str] = []
    broken, other = Loop(events, "broken", fail=True), FlushedLoop(events, "other")
    with capture_logs() as logs:
        async with _service() as service:
            service.periodic("broken", broken, 0.01)
            service.periodic("other", other, 0.01)
            await service.start()
            await service.serving(None, {})
            await until(lambda: _true(other.running.is_set()), "the other loop running")
            await until(
                lambda: _true(any(e["event"] == "periodic task failed" for e in logs)),
                "the failure logged",
            )
    assert events == ["other cancelled", "other flushed"]
    failed = [e for e in logs if e["event"] == "periodic task failed"]
    assert failed[0]["task"] == "broken" and "broken broke" in failed[0]["error"]
    assert service.running() == []


async def test_a_second_stop_while_the_first_runs_waits_for_it_and_does_nothing() -> None:
    events: list[str] = []
    release = asyncio.Event()
    service = _service()
    service.closing(_closer(events, "redis"))
    await service.start()
    await service.serving(None, {})

    async def drain() -> None:
        events.append("drain")
        await release.wait()

    service.on_drain(drain)
    first = asyncio.create_task(service.stop())
    second = asyncio.create_task(service.stop())
    await until(lambda: _true(events == ["drain"]), "the first stop draining")
    assert not second.done()  # it waits for the first
    release.set()
    await asyncio.gather(first, second)
    await service.stop()
    assert events == ["drain", "redis closed"]


async def test_a_start_that_fails_closes_what_was_made_and_never_drains() -> None:
    events: list[str] = []
    server = grpc.aio.server()
    with capture_logs() as logs, pytest.raises(OSError, match="no port"):
        async with _service() as service:
            service.closing(_closer(events, "redis"))
            service.server(server, "127.0.0.1", 0)
            service.on_drain(lambda: events.append("drain"))
            await service.start()
            raise OSError("no port")
    assert events == ["redis closed"]
    assert not [e for e in logs if e["event"] == "test stopped"]  # it never served


async def test_a_drain_step_that_fails_is_raised_once_everything_is_closed() -> None:
    events: list[str] = []

    def broken() -> None:
        raise RuntimeError("loop failed")

    with pytest.raises(RuntimeError, match="loop failed"):
        async with _service() as service:
            service.closing(_closer(events, "redis"))
            service.on_drain(broken)
            service.on_drain(lambda: events.append("next drain step"))
            await service.start()
            await service.serving(None, {})
    assert events == ["next drain step", "redis closed"]


# -- the four services ---------------------------------------------------------------------


async def test_each_service_stops_in_two_stages(
    redis_url: str, model_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every service started by `serve` answers NOT_SERVING on its probe before its drain
    runs, and once stopped has no periodic task left running and said it stopped."""
    services: list[Service] = []
    seen: dict[str, list[int]] = {}
    init = Service.__init__
    on_drain = Service.on_drain

    def recorded(self: Service, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        services.append(self)

    def watched(self: Service, hook: service_module.Step) -> None:
        async def checked() -> None:
            seen.setdefault(self.name, []).append(await _status(self.probe_port))
            result = hook()
            if asyncio.iscoroutine(result):
                await result

        on_drain(self, checked)

    monkeypatch.setattr(Service, "__init__", recorded)
    monkeypatch.setattr(Service, "on_drain", watched)
    mesh = await start_mesh(redis_url, model_repo, common_overrides={"health_port": 0})
    by_name = {s.name: s for s in services}
    assert sorted(by_name) == ["gateway", "postprocess", "router", "worker"]
    for name, ports in mesh.ports.items():
        assert await _status(ports["probe_port"]) == SERVING, name
    with capture_logs() as logs:
        await mesh.close()
    for name, service in by_name.items():
        assert seen[name] == [NOT_SERVING], name
        assert service.running() == [], name
        assert [e for e in logs if e["event"] == f"{name} stopped"], name
        with pytest.raises(grpc.aio.AioRpcError):
            await _status(mesh.ports[name]["probe_port"])
