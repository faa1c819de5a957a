"""Composition root of the router: `python -m tiermesh.router`."""

from __future__ import annotations

import asyncio

from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.redis_client import RedisRefused
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import ReadyCallback, make_server
from tiermesh.core.service import Refusal, Service, main
from tiermesh.core.settings import RouterSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import caller_checks, internal_server_credentials
from tiermesh.rollout.controller import router_rollouts
from tiermesh.router.admission import Admitter
from tiermesh.router.batch_feeder import Feeder
from tiermesh.router.encoders import Encoders
from tiermesh.router.health_metrics import HealthCollector
from tiermesh.router.metrics import QueueCollector, RouterMetrics
from tiermesh.router.routing import BatchRouter, JobChecks
from tiermesh.router.servicer import RouterServicer
from tiermesh.router.stranded import StrandedWork
from tiermesh.v1 import router_pb2_grpc


async def serve(
    settings: RouterSettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    repo = ModelRepository(settings.model_repository)
    repo.load()
    async with Service("router", settings, telemetry) as service:
        redis = await service.redis()  # wrong credentials: not started
        telemetry = service.telemetry
        server = make_server(telemetry, guards=caller_checks(settings))  # gateways, front doors
        encoders = Encoders(repo)
        registry, metrics_port = service.metrics(settings.metrics_port)
        for collector in (  # queue lengths; queue age, dead letters, workers
            QueueCollector(settings.redis_url, repo.configs),
            HealthCollector(settings.redis_url, repo.configs),
        ):
            registry.register(collector)
            service.closing(collector.close)
        rollouts, controller = router_rollouts(
            redis, repo.configs, registry, settings.rollout_lock_ttl_ms
        )
        control = ControlWatch(redis, repo)
        servicer = RouterServicer(
            BatchRouter(
                settings,
                repo,
                Admitter(redis),
                encoders.text,
                RouterMetrics(registry),
                rollouts=rollouts,
                control=control,
                prompts=encoders.prompts,
                checks=JobChecks.from_settings(settings),
            )
        )
        router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
        # Batches being routed finish within the grace; the streams end once answered.
        credentials = internal_server_credentials(settings)
        port = service.server(server, settings.router_host, settings.router_port, credentials)
        service.on_drain(servicer.drain)
        await service.first_read(
            rollouts.refresh(),  # a running rollout is in force from the first request
            "rollout states unreadable at start; retrying in the background",
        )
        await service.first_read(
            control.read(),  # what is unloaded is refused from the first request
            "model control state unreadable at start; retrying in the background",
        )
        control.on_change = encoders.on_control_change
        feeder = Feeder.from_settings(settings, redis, repo, encoders.text)
        stranded = StrandedWork(redis, repo.configs, registry)
        service.periodic("rollout-states", rollouts, settings.rollout_refresh_ms / 1000)
        service.periodic("rollout-controller", controller, settings.rollout_eval_interval_ms / 1000)
        service.periodic("model-control", control, settings.model_control_refresh_ms / 1000)
        service.periodic("batch-feeder", feeder, settings.batch_feed_interval_ms / 1000)
        service.periodic("stranded-work", stranded, settings.stranded_interval_ms / 1000)
        await service.start()
        await service.serving(ready, {"port": port, "metrics_port": metrics_port})
        service.counters(lambda: {"batches": servicer.batches, "jobs": servicer.jobs})
        await service.run(stop)


if __name__ == "__main__":
    main("router", RouterSettings, serve, (Refusal((RedisRefused,)),))
