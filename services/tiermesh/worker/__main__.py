"""Composition root of the batcher-worker: `python -m tiermesh.worker`."""

from __future__ import annotations

import asyncio
import os
import socket

import structlog

from tiermesh.batch.store import BatchStore
from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.delivery_client import GatewayClients, deliveries_counter
from tiermesh.core.metrics import new_registry
from tiermesh.core.redis_client import RedisRefused
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.server import ReadyCallback, bind, make_channel, make_server
from tiermesh.core.service import Refusal, Service, main
from tiermesh.core.serving import worker_units
from tiermesh.core.sessions import ProviderUnavailable
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import internal_channel_credentials, internal_server_credentials
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.generation import GenerationTimers, GenerationWorker
from tiermesh.worker.handoff import DirectHandoff, Handoff, PostprocessClient
from tiermesh.worker.lifecycle import Loops
from tiermesh.worker.loop import Worker
from tiermesh.worker.metrics import GenerationMetrics, WorkerMetrics
from tiermesh.worker.opening import Opener
from tiermesh.worker.streams import StreamClient
from tiermesh.worker.units import UnitControl

log = structlog.get_logger("tiermesh.worker")
# Generative models are served on this tier only (they have no tiers of their own).
GENERATION_TIER = "center"


async def serve(
    settings: WorkerSettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    if not settings.worker_online and not settings.batch_jobs:
        raise ValueError(
            "TIERMESH_WORKER_ONLINE=false makes a batch pool worker: it needs "
            "TIERMESH_BATCH_JOBS=true, or it would read nothing"
        )
    repo = ModelRepository(settings.model_repository)
    configs = repo.load()
    names = settings.model_names or sorted(n for n, c in configs.items() if not c.companion_of)
    unknown = [n for n in names if n not in configs or configs[n].companion_of]
    if unknown:
        raise RepositoryError(f"worker asked to serve unknown model(s): {', '.join(unknown)}")
    async with Service("worker", settings, telemetry) as service:
        redis = await service.redis()  # wrong credentials: not started
        watch = ControlWatch(redis, repo)
        await service.first_read(
            watch.read(),  # a model unloaded through model control gets no session
            "model control state unreadable at start; serving every model until read",
        )
        # One session per (version, variant) the config lists: a request that names an older
        # version is computed by that version's weights, not the latest's.
        served = worker_units(configs, names, watch.state.unloaded)
        registry = new_registry()
        opener = Opener(settings, repo, registry)
        runners = opener.runners(served)
        # Generative models run on the center tier, in a loop of their own per unit.
        generative = {
            unit: cfg
            for unit, cfg in worker_units(configs, names, watch.state.unloaded, True).items()
            if settings.worker_tier == GENERATION_TIER and settings.worker_online
        }
        opened = opener.generatives(generative)
        credentials = internal_channel_credentials(settings)
        channel = make_channel(
            settings.postprocess_address, settings.max_message_bytes, credentials
        )
        service.closing(channel.close)
        host = socket.gethostname()
        consumer = settings.worker_id or f"{host}-{settings.worker_tier}-{os.getpid()}"
        metrics_server = service.metrics_server(registry, settings.metrics_port)
        stream_client = StreamClient(
            redis,
            consumer,
            dead_letter_max_len=settings.dead_letter_max_len,
            dead_letter_max_payload_bytes=settings.dead_letter_max_payload_bytes,
        )
        service.closing(stream_client.aclose)
        to_postprocess = PostprocessClient(channel, max_message_bytes=settings.max_message_bytes)
        postprocess: Handoff = (
            DirectHandoff(
                to_postprocess,
                GatewayClients.from_settings(settings),
                deliveries_counter(registry),
            )
            if settings.direct_delivery
            else to_postprocess
        )
        service.closing(postprocess.close)
        worker_metrics = WorkerMetrics(registry)
        # Generative units' providers here; batched units' as the loop opens them (Worker.open).
        for unit, gen in opened.items():
            worker_metrics.session_provider(unit, settings.worker_tier, gen.provider)
        worker = Worker(
            tier=settings.worker_tier,
            configs=served,
            runners=runners,
            streams=stream_client,
            handoff=postprocess,
            telemetry=service.telemetry,
            poll_block_ms=settings.poll_block_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            heartbeat_ttl_ms=settings.heartbeat_ttl_ms,
            metrics=worker_metrics,
            reclaim_interval_ms=settings.reclaim_interval_ms,
            reclaim_min_idle_ms=settings.reclaim_min_idle_ms,
            max_deliveries=settings.max_deliveries,
            control=UnitControl(
                # Empty names: every model, including ones added to the folder later.
                watch,
                repo,
                settings.model_names,
                opener,
                settings.model_control_refresh_ms / 1000,
            ),
            background=BackgroundResults(BatchStore(redis, settings.batch_retention_s), served)
            if settings.batch_jobs
            else None,
            background_share=settings.batch_background_share,
            background_target_wait_ms=settings.batch_target_wait_ms,
            online=settings.worker_online,
            lanes=opener.compute.lanes,
            max_batch_bytes=settings.max_batch_bytes,
            compute_nice=settings.compute_nice,
        )
        gen_metrics = GenerationMetrics(registry) if generative else None
        loops = Loops(
            worker,
            [
                GenerationWorker(
                    unit=unit,
                    cfg=generative[unit],
                    tier=settings.worker_tier,
                    service=gen.service,
                    text=gen.text,
                    streams=stream_client,
                    handoff=postprocess,
                    timers=GenerationTimers.from_settings(settings),
                    metrics=gen_metrics,
                    tracer=service.telemetry.tracer,
                    provider=gen.provider,
                )
                for unit, gen in opened.items()
            ],
        )
        server = make_server(service.telemetry)
        service.server(server, grace_s=1.0)
        service.on_drain(
            lambda: loops.drain(settings.leave_window_ms / 1000, settings.shutdown_grace_s)
        )
        credentials = internal_server_credentials(settings)
        port = bind(server, settings.worker_host, settings.worker_health_port, credentials)
        await service.start()
        running = await loops.start()
        await service.serving(ready, {"port": port, "metrics_port": metrics_server.port})
        log.info(
            "worker serving",
            models=names,
            tier=settings.worker_tier,
            health_port=port,
            metrics_port=metrics_server.port,
            compute_lanes=opener.compute.lanes,
            threads_per_lane=opener.compute.threads,
        )
        service.counters(loops.counters)
        await service.run(stop, running)


if __name__ == "__main__":
    main(
        "worker",
        WorkerSettings,
        serve,
        (Refusal((ProviderUnavailable, RepositoryError, RedisRefused)),),
        # A batch pool: online work on these cores goes first.
        prepare=lambda settings: os.nice(settings.worker_nice) if settings.worker_nice else None,
    )
