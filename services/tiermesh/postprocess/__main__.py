"""Composition root of postprocess: `python -m tiermesh.postprocess`."""

from __future__ import annotations

import asyncio

from tiermesh.core.delivery_client import GatewayClients
from tiermesh.core.output_steps import OutputSteps
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import ReadyCallback, make_server
from tiermesh.core.service import Service, main
from tiermesh.core.settings import PostprocessSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import caller_checks, internal_server_credentials
from tiermesh.postprocess.metrics import PostprocessMetrics
from tiermesh.postprocess.servicer import PostprocessServicer
from tiermesh.v1 import postprocess_pb2_grpc


async def serve(
    settings: PostprocessSettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    async with Service("postprocess", settings, telemetry) as service:
        repo = ModelRepository(settings.model_repository)
        gateways = GatewayClients.from_settings(settings)
        service.closing(gateways.close)
        # Results from workers only (core/callers.py).
        guards = caller_checks(settings)
        server = make_server(service.telemetry, settings.max_message_bytes, guards=guards)
        registry, metrics_port = service.metrics(settings.metrics_port)
        servicer = PostprocessServicer(
            OutputSteps.for_models(repo.load()), gateways, PostprocessMetrics(registry), repo=repo
        )
        postprocess_pb2_grpc.add_PostprocessServicer_to_server(servicer, server)
        # Workers stop before postprocess; batches in flight finish within the grace, and
        # then each worker's stream ends (a worker sends again what it had not had read).
        credentials = internal_server_credentials(settings)
        port = service.server(
            server, settings.postprocess_host, settings.postprocess_port, credentials
        )
        service.on_drain(servicer.drain)
        await service.start()
        await service.serving(ready, {"port": port, "metrics_port": metrics_port})
        await service.run(stop)


if __name__ == "__main__":
    main("postprocess", PostprocessSettings, serve)
