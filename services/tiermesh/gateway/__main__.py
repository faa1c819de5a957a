"""Composition root of the gateway: `python -m tiermesh.gateway`."""

from __future__ import annotations

import asyncio

from tiermesh.core.exposure import StartRefused
from tiermesh.core.prices import export_prices, load_prices
from tiermesh.core.redis_client import RedisRefused
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import ReadyCallback, make_server
from tiermesh.core.service import Refusal, Service, main
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tenants import TenantsFileError, load_tenants
from tiermesh.core.tls import caller_checks, internal_server_credentials, public_server_credentials
from tiermesh.gateway.auth import Tenants
from tiermesh.gateway.books import BooksServicer, DoorBooks
from tiermesh.gateway.capture import Capture
from tiermesh.gateway.control import ModelControl
from tiermesh.gateway.delivery import DeliveryServicer
from tiermesh.gateway.hop_spans import HopSpans
from tiermesh.gateway.live_providers import LiveProviders
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PendingRequests
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.public_port import check_exposure, public_server
from tiermesh.gateway.rest import RestDoor
from tiermesh.gateway.security import AUDIT_RETRY_MS, AccessGate, Security
from tiermesh.gateway.statistics import InferenceStatistics
from tiermesh.gateway.statistics_store import StatisticsStore
from tiermesh.gateway.upstream import Upstream
from tiermesh.rollout.recorder import OutcomeRecorder
from tiermesh.rollout.store import RolloutStore
from tiermesh.v1 import books_pb2_grpc, delivery_pb2_grpc


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
    repo = ModelRepository(settings.model_repository)
    repo.load()
    async with Service("gateway", settings, telemetry) as service:
        redis = await service.redis()  # wrong credentials: not started
        telemetry = service.telemetry
        recorder = OutcomeRecorder(
            RolloutStore(redis), {n: c.queue_model for n, c in repo.configs.items()}
        )
        upstream = Upstream.connect(settings, redis, recorder)
        service.closing(upstream.close)
        pending = PendingRequests()
        registry, metrics_port = service.metrics(settings.metrics_port)
        metrics = GatewayMetrics(registry)
        metrics.in_flight.set_function(lambda: len(pending))
        security = Security.for_tenants(tenants, redis, settings, metrics, keyless_warning)
        stats = StatisticsStore(redis, InferenceStatistics())
        control = ModelControl(
            redis, repo, upstream.liveness, settings.model_control_load_wait_ms / 1000
        )
        await service.first_read(
            control.refresh(),  # what is unloaded is refused from the first request
            "model control state unreadable at start; retrying in the background",
        )
        hop_spans = HopSpans(telemetry)
        gate = AccessGate(security, metrics)
        # Delivery from postprocess and workers, books from the front door (core/callers.py).
        internal = make_server(
            telemetry, settings.max_message_bytes, guards=caller_checks(settings)
        )
        delivery = DeliveryServicer(pending, recorder)
        rest: RestDoor | None = None  # the KServe v2 REST door, made once the plane is
        delivery_pb2_grpc.add_DeliveryServicer_to_server(delivery, internal)
        delivery_port = service.server(
            internal,
            settings.delivery_host,
            settings.delivery_port,
            internal_server_credentials(settings),
            grace_s=1.0,
            intake=False,
            # Stopped after the public side: the REST door, the control loop, then
            # postprocess's streams end (nobody here waits any more), the last deliveries.
            before_stop=(
                lambda: rest.stop() if rest is not None else None,
                lambda: service.cancel("model-control"),
                delivery.drain,
            ),
        )
        # The one data plane every door uses.
        plane = DataPlane(
            settings,
            repo,
            upstream,
            pending,
            settings.delivery_advertise or f"{settings.delivery_host}:{delivery_port}",
            metrics,
            gate,
            control=control,
            control_enabled=settings.model_control == "explicit",
            stats=stats,
            hop_spans=hop_spans,
            caller_traces=telemetry.limit_caller_traces(settings.caller_traces_per_s),
        )
        export_prices(registry, load_prices(settings.prices_file))
        plane.capture = capture = Capture.from_settings(settings, redis, tenants, registry)
        plane.live_providers = LiveProviders(redis)
        # The calls a Go front door answered itself, booked here (books.py).
        books = DoorBooks(
            repo, plane.dispatcher, upstream.cancellations, recorder, capture, hop_spans
        )
        books_pb2_grpc.add_BooksServicer_to_server(BooksServicer(books), internal)
        # The KServe v2 REST door: the same plane behind JSON and binary-data bodies.
        rest = RestDoor(plane, settings, telemetry.tracer) if settings.http_port >= 0 else None
        public = public_server(settings, telemetry, plane, redis, gate)
        # Handlers still finishing (answers being sent, refusals of late arrivals) get the
        # grace too; stop() returns as soon as they are done.
        port = service.server(
            public,
            settings.gateway_host,
            settings.gateway_port,
            public_server_credentials(settings),
            grace_s=max(1.0, settings.shutdown_grace_s),
        )
        await service.start()
        http_port = await rest.start() if rest is not None else -1
        ports = {"port": port, "delivery_port": delivery_port, "metrics_port": metrics_port}
        await service.serving(ready, {**ports, "http_port": http_port}, models=sorted(repo.configs))
        # Cancelled after the public port closed, then the last entries flushed.
        service.periodic("model-control", control, settings.model_control_refresh_ms / 1000)
        if security is not None:
            service.periodic("audit-writer", security.audit, AUDIT_RETRY_MS / 1000)
        service.periodic("rollout-recorder", recorder, settings.rollout_flush_ms / 1000)
        service.periodic("capture-writer", capture, settings.capture_flush_ms / 1000)
        service.periodic("statistics-flush", stats, settings.statistics_flush_ms / 1000)
        service.on_drain(lambda: plane.drain(settings.shutdown_grace_s))
        service.counters(plane.counters)
        await service.run(stop)


if __name__ == "__main__":
    main(
        "gateway",
        GatewaySettings,
        serve,
        (
            Refusal((TenantsFileError,), 2, "gateway not started: bad tenants file"),
            Refusal((StartRefused,), 2, "gateway not started"),
            Refusal((RedisRefused,)),
        ),
    )
