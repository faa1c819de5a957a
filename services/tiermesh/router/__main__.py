"""Composition root of the router: `python -m tiermesh.router`."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

import structlog

from tiermesh.batch.store import BatchStore
from tiermesh.core.control_watch import ControlState, ControlWatch
from tiermesh.core.metrics import new_registry
from tiermesh.core.redis_client import RedisRefused
from tiermesh.core.repository import ModelRepository
from tiermesh.core.server import ReadyCallback, bind, make_server
from tiermesh.core.service import Refusal, Service, main
from tiermesh.core.settings import RouterSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.text import TextEncoder
from tiermesh.core.tls import caller_checks, internal_server_credentials
from tiermesh.rollout.cache import RolloutStates
from tiermesh.rollout.controller import RolloutController
from tiermesh.rollout.metrics import RolloutMetrics
from tiermesh.rollout.store import RolloutStore
from tiermesh.router.admission import Admitter
from tiermesh.router.batch_feeder import Feeder
from tiermesh.router.encoders import add_encoders
from tiermesh.router.health_metrics import HealthCollector
from tiermesh.router.metrics import QueueCollector, RouterMetrics
from tiermesh.router.prompt import PromptEncoder
from tiermesh.router.routing import BatchRouter, JobChecks
from tiermesh.router.servicer import RouterServicer
from tiermesh.router.stranded import StrandedWork
from tiermesh.v1 import router_pb2_grpc

log = structlog.get_logger("tiermesh.router")


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
        encoders: dict[str, TextEncoder] = {}
        prompts: dict[str, PromptEncoder] = {}
        add_encoders(repo, encoders, prompts, strict=True)
        registry = new_registry()
        for collector in (  # queue lengths; queue age, dead letters, workers
            QueueCollector(settings.redis_url, repo.configs),
            HealthCollector(settings.redis_url, repo.configs),
        ):
            registry.register(collector)
            service.closing(collector.close)
        metrics_server = service.metrics_server(registry, settings.metrics_port)
        store = RolloutStore(redis)
        rollout_metrics = RolloutMetrics(registry)
        models = sorted(n for n, c in repo.configs.items() if not c.companion_of)
        rollouts = RolloutStates(store, models, rollout_metrics)
        control = ControlWatch(redis, repo)
        servicer = RouterServicer(
            BatchRouter(
                settings,
                repo,
                Admitter(redis),
                encoders,
                RouterMetrics(registry),
                rollouts=rollouts,
                control=control,
                prompts=prompts,
                checks=JobChecks.for_settings(settings),
            )
        )
        router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
        # Batches being routed finish within the grace; the streams end once answered.
        service.server(server)
        service.on_drain(servicer.drain)
        port = bind(
            server,
            settings.router_host,
            settings.router_port,
            internal_server_credentials(settings),
        )
        await service.first_read(
            rollouts.refresh(),  # a running rollout is in force from the first request
            "rollout states unreadable at start; retrying in the background",
        )
        await service.first_read(
            control.read(),  # what is unloaded is refused from the first request
            "model control state unreadable at start; retrying in the background",
        )

        async def on_control_change(_: ControlState) -> None:
            # The repository was re-read: a model added to the folder may need its tokenizer.
            await asyncio.to_thread(add_encoders, repo, encoders, prompts)

        control.on_change = on_control_change
        controller = RolloutController(
            store,
            repo.configs,
            owner=_owner(),
            metrics=rollout_metrics,
            states=rollouts,
            lock_ttl_ms=settings.rollout_lock_ttl_ms,
        )
        feeder = Feeder(
            BatchStore(redis, settings.batch_retention_s),
            repo,
            encoders,
            owner=_owner(),
            pinned_tier=settings.batch_tier,
            max_queued=settings.batch_max_queued,
            chunk=settings.batch_feed_chunk,
            lock_ttl_ms=settings.rollout_lock_ttl_ms,
        )
        stranded = StrandedWork(redis, repo.configs, registry)
        service.periodic("rollout-states", rollouts, settings.rollout_refresh_ms / 1000)
        service.periodic("rollout-controller", controller, settings.rollout_eval_interval_ms / 1000)
        service.periodic("model-control", control, settings.model_control_refresh_ms / 1000)
        service.periodic("batch-feeder", feeder, settings.batch_feed_interval_ms / 1000)
        service.periodic("stranded-work", stranded, settings.stranded_interval_ms / 1000)
        await service.start()
        ports = {"port": port, "metrics_port": metrics_server.port}
        await service.serving(ready, ports)
        log.info("router serving", **ports)
        service.counters(lambda: {"batches": servicer.batches, "jobs": servicer.jobs})
        await service.run(stop)


def _owner() -> str:
    """A lock holder's name: this process, and a part of its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


if __name__ == "__main__":
    main("router", RouterSettings, serve, (Refusal((RedisRefused,)),))
