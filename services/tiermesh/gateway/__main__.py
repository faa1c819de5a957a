"""Composition root of the gateway: `python -m tiermesh.gateway`."""

from __future__ import annotations

import asyncio
import sys
import time

import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from tiermesh.batch.store import BatchStore
from tiermesh.core.exposure import PublicPort, StartRefused, public_exposure
from tiermesh.core.heap import settle_heap
from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.prices import export_prices, load_prices
from tiermesh.core.redis_client import RedisRefused, check_access, connect
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import (
    ReadyCallback,
    add_health,
    bind,
    make_channel,
    make_server,
    probe_port,
    public_connection_options,
    serve_health,
    set_serving,
    stop_event_on_signals,
    stop_probe,
)
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tenants import TenantsFileError, load_tenants
from tiermesh.core.tls import (
    caller_checks,
    internal_channel_credentials,
    internal_server_credentials,
    public_server_credentials,
)
from tiermesh.gateway.audit import AuditLog
from tiermesh.gateway.auth import Tenants
from tiermesh.gateway.batch_jobs import BatchJobsServicer, caps_of
from tiermesh.gateway.books import BooksServicer, DoorBooks
from tiermesh.gateway.cache import AnswerCache
from tiermesh.gateway.call_spans import CallSpans
from tiermesh.gateway.capture import Capture, CaptureMetrics, initial_state
from tiermesh.gateway.control import ModelControl
from tiermesh.gateway.decoding import (
    PUBLIC_SERVER_OPTIONS,
    add_inference_servicer,
    add_public_servicer,
)
from tiermesh.gateway.delivery import DeliveryServicer
from tiermesh.gateway.hop_spans import HopSpans
from tiermesh.gateway.live_providers import LiveProviders
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PendingRequests
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.quota import Quota
from tiermesh.gateway.rest import RestDoor
from tiermesh.gateway.security import AccessGate, Security
from tiermesh.gateway.servicer import InferenceServicer
from tiermesh.gateway.statistics import InferenceStatistics
from tiermesh.gateway.statistics_store import StatisticsStore
from tiermesh.gateway.upstream import Cancellations, Liveness, RouterClient, Upstream
from tiermesh.rollout.recorder import OutcomeRecorder
from tiermesh.rollout.store import RolloutStore
from tiermesh.v1 import batch_pb2_grpc, books_pb2_grpc, delivery_pb2_grpc

log = structlog.get_logger("tiermesh.gateway")
# Calls open at once on the public gRPC port, per TIERMESH_MAX_IN_FLIGHT.
PUBLIC_RPCS_PER_IN_FLIGHT = 2


async def serve(
    settings: GatewaySettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    """Run the gateway until `stop` is set, then drain: refuse new requests, wait for the
    pending ones (at most shutdown_grace_s), and close."""
    # Stopped before anything listens: what the settings would expose without API keys
    # (StartRefused), a bad tenants file (TenantsFileError).
    keyless_warning = check_exposure(settings)
    tenants = Tenants(load_tenants(settings.tenants_file)) if settings.tenants_file else None
    telemetry = telemetry or Telemetry("gateway", settings.trace_dir)
    repo = ModelRepository(settings.model_repository)
    repo.load()
    redis = connect(settings.redis_url)
    await check_access(redis, settings.redis_url)  # wrong credentials: not started
    router_channel = make_channel(
        settings.router_address,
        settings.max_message_bytes,
        internal_channel_credentials(settings),
    )
    pending = PendingRequests()
    # Delivery from postprocess and workers, books from the front door (core/callers.py).
    internal = make_server(telemetry, settings.max_message_bytes, guards=caller_checks(settings))
    recorder = OutcomeRecorder(
        RolloutStore(redis), {name: cfg.queue_model for name, cfg in repo.configs.items()}
    )
    delivery = DeliveryServicer(pending, recorder)
    delivery_pb2_grpc.add_DeliveryServicer_to_server(delivery, internal)
    internal_health = add_health(internal)
    delivery_port = bind(
        internal,
        settings.delivery_host,
        settings.delivery_port,
        internal_server_credentials(settings),
    )
    delivery_address = settings.delivery_advertise or f"{settings.delivery_host}:{delivery_port}"
    upstream = Upstream(
        RouterClient(router_channel, settings.max_message_bytes // 4),
        Liveness(redis),
        Cancellations(redis),
        AnswerCache(redis),
        recorder,
    )
    registry = new_registry()
    metrics = GatewayMetrics(registry)
    metrics.in_flight.set_function(lambda: len(pending))
    metrics_server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)
    security = None
    if tenants is None:
        log.warning(
            keyless_warning
            or "the public port is unauthenticated: anyone who reaches it may use every "
            "model; set TIERMESH_TENANTS_FILE to require API keys"
        )
    else:
        audit = AuditLog(redis, settings.audit_max_len, on_lost=metrics.audit_lost.inc)
        security = Security(tenants, Quota(redis, settings.retry_after_ms), audit)
        log.info("API keys required on the public port", tenants=list(tenants.names))
    stats = StatisticsStore(redis, InferenceStatistics())
    control = ModelControl(
        redis, repo, upstream.liveness, settings.model_control_load_wait_ms / 1000
    )
    try:
        await control.refresh()  # what is unloaded is refused from the first request
    except (aioredis.RedisError, OSError):
        log.warning("model control state unreadable at start; retrying in the background")
    hop_spans = HopSpans(telemetry)
    # The one data plane every door below uses.
    gate = AccessGate(security, metrics)
    plane = DataPlane(
        settings,
        repo,
        upstream,
        pending,
        delivery_address,
        metrics,
        gate,
        control=control,
        control_enabled=settings.model_control == "explicit",
        stats=stats,
        hop_spans=hop_spans,
        caller_traces=telemetry.limit_caller_traces(settings.caller_traces_per_s),
    )
    export_prices(registry, load_prices(settings.prices_file))
    plane.capture = capture = _capture(settings, redis, tenants, registry)
    plane.live_providers = LiveProviders(redis)
    # The calls a Go front door answered itself, booked here (books.py).
    books = DoorBooks(repo, plane.dispatcher, upstream.cancellations, recorder, capture, hop_spans)
    books_pb2_grpc.add_BooksServicer_to_server(BooksServicer(books), internal)
    # The KServe v2 REST door: the same plane behind JSON and binary-data bodies.
    rest = RestDoor(plane, settings, telemetry.tracer) if settings.http_port >= 0 else None
    public = make_server(
        telemetry,
        settings.max_message_bytes,
        settings.max_metadata_bytes,
        intercepted=False,
        extra_options=(
            *PUBLIC_SERVER_OPTIONS,
            *public_connection_options(settings.idle_connection_s),
        ),
        max_receive_bytes=settings.max_request_bytes,
        # The last guard, before any handler runs (and so with no retry-after): the data
        # plane's own limits refuse first, and streams and health watches count here too.
        max_concurrent_rpcs=PUBLIC_RPCS_PER_IN_FLIGHT * settings.max_in_flight,
    )
    # Like tritonclient's add_..._to_server; compressed requests inflate within a bound,
    # unparseable ones get INVALID_ARGUMENT (decoding.py).
    spans = CallSpans(telemetry.tracer) if telemetry.exporting else None
    request_limit = settings.max_request_bytes
    add_inference_servicer(InferenceServicer(plane), public, spans, request_limit)
    batch_jobs = BatchJobsServicer(
        plane,
        BatchStore(redis, settings.batch_retention_s),
        gate=gate,
        caps=caps_of(settings),
        submit_timeout_s=settings.batch_submit_timeout_s,
    )
    add_public_servicer(
        batch_pb2_grpc.add_BatchJobsServicer_to_server, batch_jobs, public, spans, request_limit
    )
    health = add_health(public)
    port = bind(
        public, settings.gateway_host, settings.gateway_port, public_server_credentials(settings)
    )
    await internal.start()
    await public.start()
    probe = await serve_health(health, settings.health_host, settings.health_port)
    http_port = await rest.start() if rest is not None else -1
    await set_serving(health, True)
    await set_serving(internal_health, True)
    log.info(
        "gateway serving",
        port=port,
        delivery_port=delivery_port,
        metrics_port=metrics_server.port,
        http_port=http_port,
        models=sorted(repo.configs),
    )
    if ready is not None:
        ready(
            {
                "port": port,
                "delivery_port": delivery_port,
                "metrics_port": metrics_server.port,
                "http_port": http_port,
                "probe_port": probe_port(probe),
            }
        )
    # Owned here: cancelled after the public port closed, then the last entries flushed.
    audit_task = asyncio.create_task(security.audit.run()) if security else None
    flusher = asyncio.create_task(
        recorder.run(settings.rollout_flush_ms / 1000), name="rollout-recorder"
    )
    capture_task = asyncio.create_task(
        capture.run(settings.capture_flush_ms / 1000), name="capture-writer"
    )
    control_task = asyncio.create_task(
        control.run(settings.model_control_refresh_ms / 1000), name="model-control"
    )
    stats_task = asyncio.create_task(
        stats.run(settings.statistics_flush_ms / 1000), name="statistics-flush"
    )
    try:
        await stop.wait()
    finally:
        log.info("gateway draining", pending=len(pending))
        plane.draining = True
        await set_serving(health, False)
        try:
            await asyncio.wait_for(pending.wait_empty(), settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("drain grace passed with requests pending", pending=len(pending))
        # Handlers still finishing (answers being sent, refusals of late arrivals) get the
        # grace too; stop() returns as soon as they are done.
        await public.stop(grace=max(1.0, settings.shutdown_grace_s))
        if rest is not None:
            await rest.stop()
        control_task.cancel()
        await asyncio.gather(control_task, return_exceptions=True)
        delivery.drain()  # postprocess's streams end: nobody here waits any more
        await internal.stop(grace=1.0)
        if audit_task is not None and security is not None:
            audit_task.cancel()
            await asyncio.gather(audit_task, return_exceptions=True)
            await security.audit.flush()  # the entries of the last calls
        flusher.cancel()
        await asyncio.gather(flusher, return_exceptions=True)
        await recorder.flush()  # the outcomes of the last calls
        capture_task.cancel()
        await asyncio.gather(capture_task, return_exceptions=True)
        await capture.flush()  # the last captured requests
        stats_task.cancel()
        await asyncio.gather(stats_task, return_exceptions=True)
        await stats.flush()  # the figures of the last calls
        await upstream.router.close()  # its stream's pump and reader, then the channel
        await router_channel.close()
        await redis.aclose()
        metrics_server.close()
        await stop_probe(probe)
        telemetry.shutdown()
        log.info(
            "gateway stopped",
            accepted=plane.accepted,
            answered=plane.answered,
            late_results=pending.late,
            router_jobs=upstream.router.jobs,
            router_batches=upstream.router.batches,
        )


def check_exposure(settings: GatewaySettings) -> str:
    """StartRefused for explicit model control without API keys, and for a public port
    beyond loopback without them unless TIERMESH_INSECURE (core/exposure.py); else the
    warning to log ("" = none)."""
    ports = [
        PublicPort("gRPC", settings.gateway_host, settings.gateway_port, "TIERMESH_GATEWAY_HOST")
    ]
    if settings.http_port >= 0:
        ports.append(
            PublicPort("REST", settings.http_host, settings.http_port, "TIERMESH_HTTP_HOST")
        )
    decided = public_exposure(
        ports,
        keys=settings.tenants_file is not None,
        insecure=settings.insecure,
        opt_out="TIERMESH_INSECURE=true",
        model_control=settings.model_control,
        control_setting="TIERMESH_MODEL_CONTROL=explicit",
    )
    if decided.refusal:
        raise StartRefused(decided.refusal)
    return decided.warning


def _capture(
    settings: GatewaySettings, redis: Redis, tenants: Tenants | None, registry: CollectorRegistry
) -> Capture:
    """Traffic capture as the settings start it (`tiermesh bench capture` changes it live)."""
    return Capture(
        redis,
        initial_state(settings.capture_sample_rate, settings.capture_window_s, time.time() * 1e3),
        max_len=settings.capture_max_len,
        contents_tenants=tenants.capture_contents if tenants is not None else (),
        contents_key=settings.capture_contents_key,
        contents_ttl_s=settings.capture_contents_ttl_s,
        metrics=CaptureMetrics(registry),
    )


async def _main() -> None:
    settings = GatewaySettings()
    configure_logging("gateway", settings.log_level, settings.log_format)
    try:
        await serve(settings, stop_event_on_signals(), ready=settle_heap)
    except TenantsFileError as exc:
        log.error("gateway not started: bad tenants file", problem=str(exc))
        sys.exit(2)
    except StartRefused as exc:
        log.error("gateway not started", problem=str(exc))
        sys.exit(2)
    except RedisRefused as exc:  # what the operator must change: one line, no traceback
        print(f"tiermesh gateway: cannot start: {exc}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    asyncio.run(_main())
