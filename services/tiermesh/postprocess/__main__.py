"""Composition root of postprocess: `python -m tiermesh.postprocess`."""

from __future__ import annotations

import asyncio

import structlog

from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.heap import settle_heap
from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.output_steps import OutputSteps
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import (
    ReadyCallback,
    add_health,
    bind,
    make_server,
    probe_port,
    serve_health,
    set_serving,
    stop_event_on_signals,
    stop_probe,
)
from tiermesh.core.settings import PostprocessSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import (
    caller_checks,
    internal_channel_credentials,
    internal_server_credentials,
)
from tiermesh.postprocess.metrics import PostprocessMetrics
from tiermesh.postprocess.servicer import PostprocessServicer
from tiermesh.v1 import postprocess_pb2_grpc

log = structlog.get_logger("tiermesh.postprocess")


async def serve(
    settings: PostprocessSettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    telemetry = telemetry or Telemetry("postprocess", settings.trace_dir)
    repo = ModelRepository(settings.model_repository)
    gateways = GatewayClients(
        settings.delivery_timeout_ms / 1000,
        internal_channel_credentials(settings),
        settings.max_message_bytes,
        settings.delivery_tls_server_name,
    )
    # Results from workers only (core/callers.py).
    server = make_server(telemetry, settings.max_message_bytes, guards=caller_checks(settings))
    registry = new_registry()
    metrics_server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)
    servicer = PostprocessServicer(
        OutputSteps.for_models(repo.load()),
        gateways,
        PostprocessMetrics(registry),
        repo=repo,
    )
    postprocess_pb2_grpc.add_PostprocessServicer_to_server(servicer, server)
    health = add_health(server)
    port = bind(
        server,
        settings.postprocess_host,
        settings.postprocess_port,
        internal_server_credentials(settings),
    )
    await server.start()
    probe = await serve_health(health, settings.health_host, settings.health_port)
    await set_serving(health, True)
    log.info("postprocess serving", port=port, metrics_port=metrics_server.port)
    if ready is not None:
        ready({"port": port, "metrics_port": metrics_server.port, "probe_port": probe_port(probe)})
    try:
        await stop.wait()
    finally:
        await set_serving(health, False)
        # Workers stop before postprocess; batches in flight finish within the grace, and
        # then each worker's stream ends (a worker sends again what it had not had read).
        servicer.drain()
        await server.stop(grace=settings.shutdown_grace_s)
        await gateways.close()
        metrics_server.close()
        await stop_probe(probe)
        telemetry.shutdown()
        log.info("postprocess stopped")


async def _main() -> None:
    settings = PostprocessSettings()
    configure_logging("postprocess", settings.log_level, settings.log_format)
    await serve(settings, stop_event_on_signals(), ready=settle_heap)


if __name__ == "__main__":
    asyncio.run(_main())
