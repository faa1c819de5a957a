"""Composition root of the batcher-worker: `python -m tiermesh.worker`."""

from __future__ import annotations

import asyncio
import os

from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.redis_client import RedisRefused
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.server import ReadyCallback, make_server
from tiermesh.core.service import Refusal, Service, main
from tiermesh.core.sessions import ProviderUnavailable
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import internal_server_credentials
from tiermesh.worker.handoff import handoff_for
from tiermesh.worker.lifecycle import Loops
from tiermesh.worker.streams import StreamClient


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
        registry, metrics_port = service.metrics(settings.metrics_port)
        streams = StreamClient.from_settings(redis, settings)
        service.closing(streams.aclose)
        handoff, channel = handoff_for(settings, registry)
        service.closing(channel.close)
        service.closing(handoff.close)
        telemetry = service.telemetry
        loops = Loops.open(
            settings, names, repo, redis, watch, streams, handoff, telemetry, registry
        )
        port = service.server(
            make_server(telemetry),
            settings.worker_host,
            settings.worker_health_port,
            internal_server_credentials(settings),
            grace_s=1.0,
        )
        service.on_drain(
            lambda: loops.drain(settings.leave_window_ms / 1000, settings.shutdown_grace_s)
        )
        await service.start()
        running = await loops.start()
        await service.serving(
            ready,
            {"port": port, "metrics_port": metrics_port},
            models=names,
            tier=settings.worker_tier,
            health_port=port,
            compute_lanes=loops.compute.lanes,
            threads_per_lane=loops.compute.threads,
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
