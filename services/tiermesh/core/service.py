"""One service's lifecycle: its gRPC servers and their health, the probe, the periodic tasks
it owns, what it closes, and the two-stage stop every service shares (DESIGN.md, Style 4).

A composition root builds its objects, registers them here, and runs:

    async with Service("router", settings, telemetry) as service:
        redis = await service.redis()
        registry, metrics_port = service.metrics(settings.metrics_port)
        port = service.server(server, settings.router_host, settings.router_port, credentials)
        service.on_drain(servicer.drain)
        service.periodic("stranded-work", StrandedWork(redis, ...), interval_s)
        await service.start()
        await service.serving(ready, {"port": port, "metrics_port": metrics_port})
        await service.run(stop)

Leaving the block stops the service, whether `stop` was set, a start step raised or the
task was cancelled:
  stage 1, stop intake: every intake server's health NOT_SERVING, then the drain hooks in
    the order given (a gateway's pending requests, a worker's leave and last batches);
  drain: the servers stop, the last registered first, each with its grace (the calls in
    flight finish) after the hooks registered to run before it;
  stage 2: the periodic tasks cancelled and flushed in registration order, what was
    registered to close closed in reverse order, the probe stopped, telemetry shut down,
    and "<name> stopped" logged with the service's counters.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

import grpc
import redis.asyncio as aioredis
import structlog
from grpc_health.v1.health import aio as health_aio
from prometheus_client import CollectorRegistry

from tiermesh.core.heap import settle_heap
from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.redis_client import check_access, connect
from tiermesh.core.server import (
    ReadyCallback,
    add_health,
    bind,
    probe_port,
    serve_health,
    set_serving,
    stop_event_on_signals,
    stop_probe,
)
from tiermesh.core.settings import ServiceSettings
from tiermesh.core.telemetry import Telemetry

log = structlog.get_logger("tiermesh.service")
S = TypeVar("S", bound=ServiceSettings)

# A step of the stop: a plain call or one that returns something to await.
Step = Callable[[], object]


class PeriodicTask(Protocol):
    """A loop a service runs in the background until its stop cancels it: a poller, a
    flusher, a controller."""

    async def run(self, interval_s: float) -> None:
        """Work in rounds `interval_s` apart until cancelled; a round that fails on Redis
        is retried in the next one."""


@runtime_checkable
class Flushing(Protocol):
    """A periodic task that holds what it has not written yet (audit entries, rollout
    outcomes, captured requests, statistics): flushed once after it was cancelled, so the
    last calls' entries are written too."""

    def flush(self) -> Awaitable[object]: ...


@dataclass
class _Server:
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    grace_s: float | None
    intake: bool
    before_stop: tuple[Step, ...]
    started: bool = False


@dataclass
class _Periodic:
    name: str
    task: asyncio.Task[None]
    flush: Callable[[], Awaitable[object]] | None


@dataclass
class _State:
    serving: bool = False
    stopping: asyncio.Future[None] | None = None
    drain: list[Step] = field(default_factory=list)
    closers: list[Step] = field(default_factory=list)


class Service:
    """Owns what one service process runs and stops it in two stages. Built once in a
    `__main__`; used as an async context manager, whose exit is the stop."""

    def __init__(
        self, name: str, settings: ServiceSettings, telemetry: Telemetry | None = None
    ) -> None:
        self.name = name
        self.settings = settings
        self.telemetry = telemetry or Telemetry(name, settings.trace_dir)
        self.shutdown_grace_s = settings.shutdown_grace_s
        self._servers: list[_Server] = []
        self._periodic: list[_Periodic] = []
        self._state = _State()
        self._probe: tuple[grpc.aio.Server, int] | None = None
        self._counters: Callable[[], dict[str, object]] = dict
        self._log = structlog.get_logger(f"tiermesh.{name}")

    # -- registration ----------------------------------------------------------------------

    def server(
        self,
        server: grpc.aio.Server,
        host: str,
        port: int,
        credentials: grpc.ServerCredentials | None = None,
        *,
        grace_s: float | None = None,
        intake: bool = True,
        before_stop: tuple[Step, ...] = (),
    ) -> int:
        """Own `server` (started by `start` in registration order, stopped in reverse, with
        `grace_s` for the calls in flight: shutdown_grace_s when None), give it a health
        service, NOT_SERVING until `start`, and bind it on `host`:`port` (TLS with
        `credentials`; core/server.bind); the port bound. An `intake` server's health goes
        NOT_SERVING at stage 1, and the probe answers the first one's; another keeps SERVING
        until it stops (a gateway's internal port: deliveries still arrive while it drains).
        `before_stop` runs just before it stops."""
        health = add_health(server)
        grace = self.shutdown_grace_s if grace_s is None else grace_s
        self._servers.append(_Server(server, health, grace, intake, before_stop))
        return bind(server, host, port, credentials)

    def periodic(self, name: str, task: PeriodicTask, interval_s: float) -> None:
        """Run `task` from now on, `interval_s` apart, until stage 2 cancels it (and flushes
        it where it is `Flushing`). A task that fails is logged; the others run on."""
        run = asyncio.create_task(task.run(interval_s), name=name)
        run.add_done_callback(_log_failure)
        flush = task.flush if isinstance(task, Flushing) else None
        self._periodic.append(_Periodic(name, run, flush))

    def on_drain(self, hook: Step) -> None:
        """Call `hook` (awaiting what it returns) in stage 1, after intake stopped and before
        the servers stop: what the service finishes within shutdown_grace_s. Only for a
        service that served."""
        self._state.drain.append(hook)

    def closing(self, close: Step) -> None:
        """Call `close` (awaiting what it returns) in stage 2, after the periodic tasks and
        before what was registered earlier: register each resource as it is made."""
        self._state.closers.append(close)

    async def redis(self) -> aioredis.Redis:
        """The client of settings.redis_url, closed last; RedisRefused where Redis refuses
        the credentials (the service does not start)."""
        redis = connect(self.settings.redis_url)
        self.closing(redis.aclose)
        await check_access(redis, self.settings.redis_url)
        return redis

    def metrics(self, port: int) -> tuple[CollectorRegistry, int]:
        """The process's metrics registry, served on settings.metrics_host:`port` (0 picks
        one) until stage 2, and the port it is served on."""
        registry = new_registry()
        server = MetricsServer(registry, self.settings.metrics_host, port)
        self.closing(server.close)
        return registry, server.port

    def counters(self, read: Callable[[], dict[str, object]]) -> None:
        """What the "<name> stopped" line says, read as the service stops."""
        self._counters = read

    # -- running ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the servers in registration order, then the probe on settings.health_host:
        health_port (-1: none) with the first intake server's health. Everything stays
        NOT_SERVING until `serving`."""
        for entry in self._servers:
            await entry.server.start()
            entry.started = True
        intake = [s.health for s in self._servers if s.intake]
        if intake:
            health = self.settings.health_host, self.settings.health_port
            self._probe = await serve_health(intake[0], *health)

    @property
    def probe_port(self) -> int:
        """The probe's port; -1 for none."""
        return probe_port(self._probe)

    async def first_read(self, read: Awaitable[object], warning: str) -> None:
        """Await a start-up read of state in Redis (a rollout, model control) that a
        periodic task keeps current later: Redis down or loading is logged as `warning`,
        and the service starts all the same."""
        try:
            await read
        except (aioredis.RedisError, OSError):
            self._log.warning(warning)

    async def serving(
        self, ready: ReadyCallback | None, ports: dict[str, int], **said: object
    ) -> None:
        """Every server's health SERVING, then `ready` told the `ports` and the probe's
        (`probe_port`), and "<name> serving" logged with the ports and what else is `said`:
        called once the service can take work."""
        for entry in self._servers:
            await set_serving(entry.health, True)
        self._state.serving = True
        if ready is not None:
            ready({**ports, "probe_port": self.probe_port})
        self._log.info(f"{self.name} serving", **ports, **said)

    async def run(self, stop: asyncio.Event, *ends: asyncio.Task[None]) -> None:
        """Return once `stop` is set or one of `ends` ended (a worker's loop that failed:
        the stop that follows says why)."""
        stopped = asyncio.create_task(stop.wait(), name=f"{self.name}-stop-signal")
        try:
            await asyncio.wait({stopped, *ends}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def __aenter__(self) -> Service:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def running(self) -> list[str]:
        """The names of the periodic tasks still running."""
        return [p.name for p in self._periodic if not p.task.done()]

    # -- stopping --------------------------------------------------------------------------

    async def cancel(self, name: str) -> None:
        """Cancel (and flush) the periodic task `name` now, ahead of stage 2: a stop step of
        a loop that must end before a server stops."""
        for periodic in [p for p in self._periodic if p.name == name]:
            self._periodic.remove(periodic)
            await self._end(periodic)

    async def _end(self, periodic: _Periodic) -> None:
        periodic.task.cancel()
        await asyncio.gather(periodic.task, return_exceptions=True)
        if periodic.flush is not None:
            await _step(f"{periodic.name}: flush", periodic.flush)

    async def stop(self) -> None:
        """The two-stage stop (see the module's docstring); every step runs even when one
        before it failed (logged). Raises the first drain hook's failure once all is done: a
        worker's loop that failed ends its service with its error. A second call waits for
        the first one's end and does nothing more."""
        if self._state.stopping is not None:
            await asyncio.shield(self._state.stopping)
            return
        self._state.stopping = asyncio.get_running_loop().create_future()
        try:
            failure = await self._stop()
        finally:
            self._state.stopping.set_result(None)
        if failure is not None:
            raise failure

    async def _stop(self) -> Exception | None:
        failure: Exception | None = None
        served = self._state.serving
        if served:
            for entry in self._servers:
                if entry.intake:
                    await _step(f"{self.name}: health", set_serving(entry.health, False))
            for hook in self._state.drain:
                try:
                    if inspect.isawaitable(result := hook()):
                        await result
                except Exception as exc:  # the others still run; raised after the stop
                    log.error("drain step failed", service=self.name, error=repr(exc))
                    failure = failure or exc
        for entry in reversed(self._servers):
            if not entry.started:
                continue
            for before in entry.before_stop:
                await _step(f"{self.name}: before a server stops", before)
            await _step(f"{self.name}: server stop", entry.server.stop(entry.grace_s))
        for periodic in self._periodic:
            await self._end(periodic)
        for close in reversed(self._state.closers):
            await _step(f"{self.name}: close", close)
        await _step(f"{self.name}: probe stop", stop_probe(self._probe))
        self.telemetry.shutdown()
        if served:
            self._log.info(f"{self.name} stopped", **self._counters())
        return failure


async def _step(what: str, step: Step | Awaitable[object]) -> None:
    """Run one stop step (a call, a call's result to await, or an awaitable); a failure is
    logged and the stop goes on."""
    try:
        result = step() if callable(step) else step
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        log.error("stop step failed", step=what, error=repr(exc))


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("periodic task failed", task=task.get_name(), error=repr(exc), exc_info=exc)


@dataclass(frozen=True)
class Refusal:
    """Errors that stop a service before it serves for something the operator must change:
    said in one line, no traceback, and the process exits with `exit_code`. Logged as
    `logged` (with the problem) where given, else written to stderr as
    "tiermesh <name>: cannot start: <problem>"."""

    errors: tuple[type[Exception], ...]
    exit_code: int = 1
    logged: str = ""


def main(
    name: str,
    settings_type: Callable[[], S],
    serve: Callable[[S, asyncio.Event, Telemetry | None, ReadyCallback | None], Awaitable[None]],
    refusals: tuple[Refusal, ...] = (),
    prepare: Callable[[S], object] | None = None,
) -> None:
    """`python -m tiermesh.<name>`: settings from the environment, logging, `prepare` (a
    worker's niceness), then `serve` until SIGINT or SIGTERM, the heap settled once it is
    ready (core/heap.py)."""

    async def run() -> None:
        settings = settings_type()
        configure_logging(name, settings.log_level, settings.log_format)
        if prepare is not None:
            prepare(settings)
        try:
            await serve(settings, stop_event_on_signals(), None, settle_heap)
        except Exception as exc:
            refusal = next((r for r in refusals if isinstance(exc, r.errors)), None)
            if refusal is None:
                raise
            if refusal.logged:
                structlog.get_logger(f"tiermesh.{name}").error(refusal.logged, problem=str(exc))
            else:
                problem = " ".join(str(exc).split())
                print(f"tiermesh {name}: cannot start: {problem}", file=sys.stderr)
            sys.exit(refusal.exit_code)

    asyncio.run(run())
