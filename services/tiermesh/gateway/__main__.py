"""Composition root of the gateway: `python -m tiermesh.gateway`."""

from __future__ import annotations

import asyncio

import structlog
from tritonclient.grpc import service_pb2_grpc

from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.redis_client import connect
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import (
    ReadyCallback,
    add_health,
    bind,
    make_channel,
    make_server,
    set_serving,
    stop_event_on_signals,
)
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.gateway.cache import ResponseCache
from tiermesh.gateway.metrics import GatewayMetrics
from tiermesh.gateway.pending import PendingRequests
from tiermesh.gateway.servicer import DeliveryServicer, InferenceServicer
from tiermesh.gateway.upstream import Cancellations, Liveness, RouterClient, Upstream
from tiermesh.v1 import delivery_pb2_grpc

log = structlog.get_logger("tiermesh.gateway")


async def serve(
    settings: GatewaySettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    """Run the gateway until `stop` is set, then drain: refuse new requests, wait for the
    pending ones (at most shutdown_grace_s), and close."""
    telemetry = telemetry or Telemetry("gateway", settings.trace_dir)
    repo = ModelRepository(settings.model_repository)
    repo.load()
    redis = connect(settings.redis_url)
    router_channel = make_channel(settings.router_address, telemetry, settings.max_message_bytes)
    pending = PendingRequests()
    internal = make_server(telemetry, settings.max_message_bytes)
    delivery_pb2_grpc.add_DeliveryServicer_to_server(DeliveryServicer(pending, telemetry), internal)
    internal_health = add_health(internal)
    delivery_port = bind(internal, settings.delivery_host, settings.delivery_port)
    delivery_address = settings.delivery_advertise or f"{settings.delivery_host}:{delivery_port}"
    upstream = Upstream(
        RouterClient(router_channel), Liveness(redis), Cancellations(redis), ResponseCache(redis)
    )
    registry = new_registry()
    metrics = GatewayMetrics(registry)
    metrics.in_flight.set_function(lambda: len(pending))
    metrics_server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)
    inference = InferenceServicer(settings, repo, upstream, pending, delivery_address, metrics)
    public = make_server(telemetry, settings.max_message_bytes)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(inference, public)
    health = add_health(public)
    port = bind(public, settings.gateway_host, settings.gateway_port)
    await internal.start()
    await public.start()
    await set_serving(health, True)
    await set_serving(internal_health, True)
    log.info(
        "gateway serving",
        port=port,
        delivery_port=delivery_port,
        metrics_port=metrics_server.port,
        models=sorted(repo.configs),
    )
    if ready is not None:
        ready({"port": port, "delivery_port": delivery_port, "metrics_port": metrics_server.port})
    try:
        await stop.wait()
    finally:
        log.info("gateway draining", pending=len(pending))
        inference.draining = True
        await set_serving(health, False)
        try:
            await asyncio.wait_for(pending.wait_empty(), settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("drain grace passed with requests pending", pending=len(pending))
        # Handlers still finishing (answers being sent, refusals of late arrivals) get the
        # grace too; stop() returns as soon as they are done.
        await public.stop(grace=max(1.0, settings.shutdown_grace_s))
        await internal.stop(grace=1.0)
        await router_channel.close()
        await redis.aclose()
        metrics_server.close()
        telemetry.shutdown()
        log.info(
            "gateway stopped",
            accepted=inference.accepted,
            answered=inference.answered,
            late_results=pending.late,
        )


async def _main() -> None:
    settings = GatewaySettings()
    configure_logging("gateway", settings.log_level, settings.log_format)
    await serve(settings, stop_event_on_signals())


if __name__ == "__main__":
    asyncio.run(_main())
