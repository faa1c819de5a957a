"""Composition root of the batcher-worker: `python -m tiermesh.worker`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys

import redis.asyncio as aioredis
import structlog

from tiermesh.batch.store import BatchStore
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.delivery_client import GatewayClients, deliveries_counter
from tiermesh.core.heap import settle_heap
from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.redis_client import RedisRefused, check_access, connect
from tiermesh.core.repository import ModelConfig, ModelRepository, RepositoryError
from tiermesh.core.server import (
    ReadyCallback,
    add_health,
    bind,
    make_channel,
    make_server,
    probe_port,
    serve_health,
    set_serving,
    stop_event_on_signals,
    stop_probe,
)
from tiermesh.core.serving import worker_units
from tiermesh.core.sessions import ProviderUnavailable
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tls import internal_channel_credentials, internal_server_credentials
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.generation import GenerationTimers, GenerationWorker
from tiermesh.worker.handoff import DirectHandoff, Handoff, PostprocessClient
from tiermesh.worker.lanes import cores_available, plan
from tiermesh.worker.loop import Worker
from tiermesh.worker.metrics import GenerationMetrics, WorkerMetrics
from tiermesh.worker.runner import ComputeTime, ModelRunner
from tiermesh.worker.streams import StreamClient
from tiermesh.worker.units import UnitControl, open_generative, open_runner, provider_choice

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
    telemetry = telemetry or Telemetry("worker", settings.trace_dir)
    repo = ModelRepository(settings.model_repository)
    configs = repo.load()
    names = settings.model_names or sorted(n for n, c in configs.items() if not c.companion_of)
    unknown = [n for n in names if n not in configs or configs[n].companion_of]
    if unknown:
        raise RepositoryError(f"worker asked to serve unknown model(s): {', '.join(unknown)}")
    redis = connect(settings.redis_url)
    await check_access(redis, settings.redis_url)  # wrong credentials: not started
    watch = ControlWatch(redis, repo)
    try:
        await watch.read()  # a model unloaded through model control gets no session
    except (aioredis.RedisError, OSError):
        log.warning("model control state unreadable at start; serving every model until read")
    # One session per (version, variant) the config lists: a request that names an older
    # version is computed by that version's weights, not the latest's.
    served = worker_units(configs, names, watch.state.unloaded)

    registry = new_registry()
    # Batched models: threads per call and lanes. Generative ones keep the threads setting:
    # their loop runs one engine step at a time.
    compute = plan(settings.intra_op_threads, settings.compute_lanes, cores_available())
    compute_time = ComputeTime(registry, per_thread=compute.threads == 1)

    # Execution providers: the worker's own setting, else each model's tier's, else CPU.
    provider_request = settings.provider_request

    def opener(unit: ComputeUnit, cfg: ModelConfig) -> ModelRunner:
        # A batch computing alone on an idle worker may use every lane's threads.
        wide = compute.threads * compute.lanes
        providers = provider_choice(
            provider_request, settings.provider_fallback, cfg, settings.worker_tier
        )
        return open_runner(repo, unit, cfg, compute.threads, compute_time, wide, providers)

    runners = {unit: opener(unit, cfg) for unit, cfg in served.items()}
    for unit, runner in runners.items():
        log.info(
            "model loaded", unit=unit, load_s=round(runner.load_s, 3), provider=runner.provider
        )
    # Generative models run on the center tier, in a loop of their own per unit.
    generative = {
        unit: cfg
        for unit, cfg in worker_units(configs, names, watch.state.unloaded, True).items()
        if settings.worker_tier == GENERATION_TIER and settings.worker_online
    }
    opened = {
        unit: open_generative(
            repo,
            unit,
            cfg,
            settings.intra_op_threads,
            provider_choice(
                provider_request, settings.provider_fallback, cfg, settings.worker_tier
            ),
        )
        for unit, cfg in generative.items()
    }
    for unit, gen in opened.items():
        log.info(
            "generative model loaded",
            unit=unit,
            load_s=round(gen.load_s, 3),
            provider=gen.provider,
        )
    channel = make_channel(
        settings.postprocess_address,
        settings.max_message_bytes,
        internal_channel_credentials(settings),
    )
    consumer = settings.worker_id or f"{socket.gethostname()}-{settings.worker_tier}-{os.getpid()}"
    metrics_server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)
    stream_client = StreamClient(
        redis,
        consumer,
        dead_letter_max_len=settings.dead_letter_max_len,
        dead_letter_max_payload_bytes=settings.dead_letter_max_payload_bytes,
    )
    to_postprocess = PostprocessClient(channel, max_message_bytes=settings.max_message_bytes)
    postprocess: Handoff = (
        DirectHandoff(
            to_postprocess,
            GatewayClients(
                settings.delivery_timeout_ms / 1000,
                internal_channel_credentials(settings),
                settings.max_message_bytes,
                settings.delivery_tls_server_name,
            ),
            deliveries_counter(registry),
        )
        if settings.direct_delivery
        else to_postprocess
    )
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
        telemetry=telemetry,
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
        lanes=compute.lanes,
        max_batch_bytes=settings.max_batch_bytes,
        compute_nice=settings.compute_nice,
    )
    gen_metrics = GenerationMetrics(registry) if generative else None
    generators = [
        GenerationWorker(
            unit=unit,
            cfg=generative[unit],
            tier=settings.worker_tier,
            service=gen.service,
            text=gen.text,
            streams=stream_client,
            handoff=postprocess,
            timers=GenerationTimers(
                poll_block_ms=settings.poll_block_ms,
                heartbeat_interval_ms=settings.heartbeat_interval_ms,
                heartbeat_ttl_ms=settings.heartbeat_ttl_ms,
                reclaim_interval_ms=settings.reclaim_interval_ms,
                reclaim_min_idle_ms=settings.reclaim_min_idle_ms,
                max_deliveries=settings.max_deliveries,
            ),
            metrics=gen_metrics,
            tracer=telemetry.tracer,
            provider=gen.provider,
        )
        for unit, gen in opened.items()
    ]
    server = make_server(telemetry)
    health = add_health(server)
    port = bind(
        server,
        settings.worker_host,
        settings.worker_health_port,
        internal_server_credentials(settings),
    )
    await server.start()
    probe = await serve_health(health, settings.health_host, settings.health_port)
    loop_task = asyncio.create_task(_run_all(worker, generators), name="worker-loop")
    started = asyncio.create_task(
        _all_started([worker.started, *(g.started for g in generators)]), name="worker-started"
    )
    await asyncio.wait({loop_task, started}, return_when=asyncio.FIRST_COMPLETED)
    if loop_task.done():
        started.cancel()
        await loop_task  # raises why the worker could not start
    await set_serving(health, True)
    log.info(
        "worker serving",
        models=names,
        tier=settings.worker_tier,
        health_port=port,
        metrics_port=metrics_server.port,
        compute_lanes=compute.lanes,
        threads_per_lane=compute.threads,
    )
    if ready is not None:
        ready({"port": port, "metrics_port": metrics_server.port, "probe_port": probe_port(probe)})
    stopper = asyncio.create_task(stop.wait(), name="worker-stop-signal")
    try:
        await asyncio.wait({loop_task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await set_serving(health, False)
        # Deregister, keep reading what routers sent until now for a moment, then stop intake.
        await worker.leave()
        for gen_worker in generators:
            await gen_worker.leave()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(loop_task), settings.leave_window_ms / 1000)
        worker.stop()
        for gen_worker in generators:
            gen_worker.stop()
        stopper.cancel()
        try:
            await asyncio.wait_for(loop_task, settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("drain grace passed; unfinished entries stay pending")
        await server.stop(grace=1.0)
        await postprocess.close()
        await channel.close()
        await stream_client.aclose()
        await redis.aclose()
        metrics_server.close()
        await stop_probe(probe)
        telemetry.shutdown()
        log.info(
            "worker stopped",
            computed_rows=worker.computed_rows,
            inline_batches=worker.inline_batches,
            expired=worker.expired,
            cancelled=worker.cancelled,
            cascaded=worker.cascaded,
            reclaimed=worker.reclaimed,
            dead_lettered=worker.dead_lettered,
        )


async def _run_all(worker: Worker, generators: list[GenerationWorker]) -> None:
    """The batched loop and each generative unit's loop; the first to fail stops them all."""
    tasks = [
        asyncio.create_task(worker.run(), name="batched-loop"),
        *(asyncio.create_task(g.run(), name=f"generation-{g.unit}") for g in generators),
    ]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _all_started(events: list[asyncio.Event]) -> None:
    for event in events:
        await event.wait()


async def _main() -> None:
    settings = WorkerSettings()
    configure_logging("worker", settings.log_level, settings.log_format)
    if settings.worker_nice:
        os.nice(settings.worker_nice)  # a batch pool: online work on these cores goes first
    await serve(settings, stop_event_on_signals(), ready=settle_heap)


if __name__ == "__main__":
    try:
        asyncio.run(_main())
    except (ProviderUnavailable, RepositoryError, RedisRefused) as exc:
        # What the operator must change (a provider, the repository, Redis's credentials): one
        # line, no traceback.
        print(f"tiermesh worker: cannot start: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(1)
