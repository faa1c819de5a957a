"""gRPC server lifecycle shared by all services: health, tracing, two-stage stop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from opentelemetry.instrumentation.grpc import aio_server_interceptor, filters

from tiermesh.core.telemetry import Telemetry

# Calls that carry no single request stay out of traces: health checks (frequent, they say
# nothing about requests), the long-lived internal streams of batches and the front door's
# books (many calls' entries a call), whose jobs each get a span of their own where their
# trace is sampled.
UNTRACED_METHODS = ("RouteStream", "ProcessStream", "DeliverStream", "Record")


def _traced() -> Any:
    """The interceptors' filter: True for the calls that get a span."""
    return filters.negate(
        filters.any_of(filters.health_check(), *map(filters.method_name, UNTRACED_METHODS))
    )


# Called once a service listens, with the ports it bound (tests bind port 0).
ReadyCallback = Callable[[dict[str, int]], None]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def make_server(
    telemetry: Telemetry,
    max_message_bytes: int = 64 * 1024 * 1024,
    max_metadata_bytes: int | None = None,
    *,
    intercepted: bool = True,
    extra_options: tuple[tuple[str, int], ...] = (),
    guards: tuple[grpc.aio.ServerInterceptor, ...] = (),
    max_receive_bytes: int | None = None,
    max_concurrent_rpcs: int | None = None,
) -> grpc.aio.Server:
    """A grpc.aio server, with the OpenTelemetry server interceptor where `telemetry`
    exports, unless not `intercepted` (a server whose servicer records its calls' spans
    itself: the gateway's public port). `max_metadata_bytes` bounds the request headers of
    a call (gRPC's own default when None); `extra_options` are further channel arguments.
    `guards` run first on every call, before any span: an internal server's caller checks
    (core/tls.caller_checks). `max_receive_bytes` bounds what it receives below
    `max_message_bytes` (a public port's requests). `max_concurrent_rpcs`: calls open at
    once beyond it are refused RESOURCE_EXHAUSTED by gRPC before any handler runs."""
    options: list[tuple[str, int]] = [
        ("grpc.max_receive_message_length", max_receive_bytes or max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # A port another server holds is refused, not shared: with gRPC's default
        # SO_REUSEPORT two servers on one port split its connections between them.
        ("grpc.so_reuseport", 0),
    ]
    if max_metadata_bytes is not None:
        # gRPC has a soft limit (calls over it refused at random) and a hard one (all refused);
        # both at one value make the limit exact.
        options += [
            ("grpc.max_metadata_size", max_metadata_bytes),
            ("grpc.absolute_max_metadata_size", max_metadata_bytes),
        ]
    options += extra_options
    # The interceptor costs ~0.1-0.2 ms of CPU per call even when no span is recorded: only
    # where spans go somewhere (benchmarks/grpc_hops.py).
    interceptors = [*guards]
    if telemetry.exporting and intercepted:
        interceptors.append(
            aio_server_interceptor(tracer_provider=telemetry.provider, filter_=_traced())
        )
    return grpc.aio.server(
        interceptors=interceptors, options=options, maximum_concurrent_rpcs=max_concurrent_rpcs
    )


# Calls one client connection may have open at once on a public port (gRPC's default has
# no bound): beyond, the client's HTTP/2 stack waits for one to end.
MAX_STREAMS_PER_CONNECTION = 1024


def public_connection_options(idle_s: float) -> tuple[tuple[str, int], ...]:
    """A public port's bounds on its connections: streams at once, an idle connection closed
    after `idle_s` (GOAWAY: a client redials when it calls again), and pings without calls
    refused more often than every 5 minutes (gRPC's own keepalive enforcement, stated)."""
    return (
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_connection_idle_ms", int(idle_s * 1000)),
        # A connection that never finishes its HTTP/2 handshake (gRPC's default: 120 s).
        ("grpc.server_handshake_timeout_ms", int(idle_s * 1000)),
        ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
        ("grpc.http2.max_ping_strikes", 2),
    )


# A restarted peer (a pod rescheduled, a process `tiermesh up` restarts) is dialled again
# within 2 s: gRPC's default backoff grows to 120 s, and every request in between fails fast
# with UNAVAILABLE. Internal peers are few and near, so redialling often costs nothing.
RECONNECT_BACKOFF = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


def make_channel(
    address: str,
    max_message_bytes: int = 64 * 1024 * 1024,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
) -> grpc.aio.Channel:
    """An internal channel: TLS with `credentials` (see core/tls.py), plaintext when None;
    the server's certificate checked against `server_name` when given, else `address`.
    No interceptor: every internal call is a long-lived stream of batches, in no trace, and
    each job or result carries its own trace context (an interceptor that lets every call
    through unrecorded still puts each message of a stream through its own queue and task)."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        *RECONNECT_BACKOFF,
    ]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


class _Health(health_aio.HealthServicer):
    """grpc's health servicer, NOT_SERVING until the service says otherwise (`set_serving`):
    grpc's own starts SERVING, so a probe passed while a worker still loaded its models."""

    def __init__(self) -> None:
        super().__init__()
        self._server_status[""] = NOT_SERVING


def add_health(server: grpc.aio.Server) -> health_aio.HealthServicer:
    health = _Health()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    return health


async def serve_health(
    health: health_aio.HealthServicer, host: str, port: int
) -> tuple[grpc.aio.Server, int] | None:
    """`health` alone, plaintext, on host:port (port -1: none; 0 picks one), started: for
    probes that present no certificate where the service's port wants one. It answers what
    the service's own health does (the same servicer)."""
    if port < 0:
        return None
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    bound = bind(server, host, port)
    await server.start()
    return server, bound


def probe_port(probe: tuple[grpc.aio.Server, int] | None) -> int:
    """The port `serve_health` bound; -1 for none."""
    return probe[1] if probe is not None else -1


async def stop_probe(probe: tuple[grpc.aio.Server, int] | None) -> None:
    if probe is not None:
        await probe[0].stop(None)


async def set_serving(health: health_aio.HealthServicer, serving: bool) -> None:
    """Mark the whole server ('' service) SERVING or NOT_SERVING."""
    await health.set("", SERVING if serving else NOT_SERVING)


def bind(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """Bind a port, TLS only with `credentials` (see core/tls.py), plaintext when None;
    return the port actually bound (port 0 picks one)."""
    address = f"{host}:{port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    if bound == 0:
        raise OSError(f"could not bind {host}:{port}")
    return int(bound)


def stop_event_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM: the signal to start a graceful stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
