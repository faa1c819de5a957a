"""Composition root of the router: `python -m tiermesh.router`."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid

import redis.asyncio as aioredis
import structlog

from tiermesh.batch.store import BatchStore
from tiermesh.core.control_watch import ControlState, ControlWatch
from tiermesh.core.heap import settle_heap
from tiermesh.core.logging import configure_logging
from tiermesh.core.metrics import MetricsServer, new_registry
from tiermesh.core.redis_client import RedisRefused, check_access, connect
from tiermesh.core.repository import ModelRepository, RepositoryError
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
from tiermesh.core.settings import RouterSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tenants import load_tenants
from tiermesh.core.text import TextEncoder
from tiermesh.core.tls import caller_checks, internal_server_credentials
from tiermesh.rollout.cache import RolloutStates
from tiermesh.rollout.controller import RolloutController
from tiermesh.rollout.metrics import RolloutMetrics
from tiermesh.rollout.store import RolloutStore
from tiermesh.router.admission import Admitter
from tiermesh.router.batch_feeder import Feeder
from tiermesh.router.health_metrics import HealthCollector
from tiermesh.router.metrics import QueueCollector, RouterMetrics
from tiermesh.router.prompt import PromptEncoder
from tiermesh.router.routing import BatchRouter, JobChecks
from tiermesh.router.servicer import RouterServicer
from tiermesh.router.stranded import StrandedWork
from tiermesh.v1 import router_pb2_grpc

log = structlog.get_logger("tiermesh.router")


def job_checks(settings: RouterSettings) -> JobChecks | None:
    """With internal mTLS only gateways' certificates reach the router (core/callers.py): no
    checks. Without it anything that reaches the port could send a job: each is checked."""
    if caller_checks(settings):
        return None
    if settings.tenants_file is None:
        return JobChecks(None)
    return JobChecks({t.name: t for t in load_tenants(settings.tenants_file)})


async def serve(
    settings: RouterSettings,
    stop: asyncio.Event,
    telemetry: Telemetry | None = None,
    ready: ReadyCallback | None = None,
) -> None:
    telemetry = telemetry or Telemetry("router", settings.trace_dir)
    repo = ModelRepository(settings.model_repository)
    repo.load()
    redis = connect(settings.redis_url)
    await check_access(redis, settings.redis_url)  # wrong credentials: not started
    server = make_server(telemetry, guards=caller_checks(settings))  # gateways, front doors
    encoders: dict[str, TextEncoder] = {}
    prompts: dict[str, PromptEncoder] = {}
    add_encoders(repo, encoders, prompts, strict=True)
    control = ControlWatch(redis, repo)
    registry = new_registry()
    metrics = RouterMetrics(registry)
    queues = QueueCollector(settings.redis_url, repo.configs)
    registry.register(queues)
    mesh_health = HealthCollector(settings.redis_url, repo.configs)  # queue age, DLQ, workers
    registry.register(mesh_health)
    metrics_server = MetricsServer(registry, settings.metrics_host, settings.metrics_port)
    store = RolloutStore(redis)
    rollout_metrics = RolloutMetrics(registry)
    models = sorted(n for n, c in repo.configs.items() if not c.companion_of)
    rollouts = RolloutStates(store, models, rollout_metrics)
    controller = RolloutController(
        store,
        repo.configs,
        owner=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
        metrics=rollout_metrics,
        states=rollouts,
        lock_ttl_ms=settings.rollout_lock_ttl_ms,
    )
    router = BatchRouter(
        settings,
        repo,
        Admitter(redis),
        encoders,
        metrics,
        rollouts=rollouts,
        control=control,
        prompts=prompts,
        checks=job_checks(settings),
    )
    servicer = RouterServicer(router)
    router_pb2_grpc.add_RouterServicer_to_server(servicer, server)
    health = add_health(server)
    port = bind(
        server, settings.router_host, settings.router_port, internal_server_credentials(settings)
    )
    try:
        await rollouts.refresh()  # a running rollout is in force from the first request
    except (aioredis.RedisError, OSError):
        log.warning("rollout states unreadable at start; retrying in the background")
    try:
        await control.read()  # what is unloaded is refused from the first request
    except (aioredis.RedisError, OSError):
        log.warning("model control state unreadable at start; retrying in the background")

    async def on_control_change(_: ControlState) -> None:
        # The repository was re-read: a model added to the folder may need its tokenizer.
        await asyncio.to_thread(add_encoders, repo, encoders, prompts)

    # Owned here, cancelled on stop.
    loops = [
        asyncio.create_task(
            rollouts.run(settings.rollout_refresh_ms / 1000), name="rollout-states"
        ),
        asyncio.create_task(
            controller.run(settings.rollout_eval_interval_ms / 1000), name="rollout-controller"
        ),
        asyncio.create_task(
            control.run(settings.model_control_refresh_ms / 1000, on_control_change),
            name="model-control",
        ),
        asyncio.create_task(
            Feeder(
                BatchStore(redis, settings.batch_retention_s),
                repo,
                encoders,
                owner=f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                pinned_tier=settings.batch_tier,
                max_queued=settings.batch_max_queued,
                chunk=settings.batch_feed_chunk,
                lock_ttl_ms=settings.rollout_lock_ttl_ms,
            ).run(settings.batch_feed_interval_ms / 1000),
            name="batch-feeder",
        ),
        asyncio.create_task(
            StrandedWork(redis, repo.configs, registry).run(settings.stranded_interval_ms / 1000),
            name="stranded-work",
        ),
    ]
    await server.start()
    probe = await serve_health(health, settings.health_host, settings.health_port)
    await set_serving(health, True)
    log.info("router serving", port=port, metrics_port=metrics_server.port)
    if ready is not None:
        ready({"port": port, "metrics_port": metrics_server.port, "probe_port": probe_port(probe)})
    try:
        await stop.wait()
    finally:
        await set_serving(health, False)
        # Batches being routed finish within the grace; the streams end once answered.
        servicer.drain()
        await server.stop(grace=settings.shutdown_grace_s)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await redis.aclose()
        metrics_server.close()
        queues.close()
        mesh_health.close()
        await stop_probe(probe)
        telemetry.shutdown()
        log.info("router stopped", batches=servicer.batches, jobs=servicer.jobs)


def add_encoders(
    repo: ModelRepository,
    encoders: dict[str, TextEncoder],
    prompts: dict[str, PromptEncoder],
    strict: bool = False,
) -> None:
    """A text encoder for every tokenized model of the repository that has none yet, and a
    prompt encoder for every generative one. A tokenizer whose files do not check stops the
    start (`strict`); later (a model added to the folder) it is left out and logged."""
    for name, cfg in repo.configs.items():
        # Only the files read here are checked (the weights beside them are the worker's).
        if name in encoders or name in prompts:
            continue
        if cfg.generation is not None:
            reads = [cfg.generation.tokenizer_file, cfg.generation.chat_file]
        elif cfg.tokenize is not None:
            reads = [cfg.tokenize.tokenizer_file]
        else:
            continue
        try:
            folder = repo.checked_files(name, reads)
        except RepositoryError as exc:
            if strict:
                raise
            log.error("tokenizer not loaded: files do not check", model=name, problem=str(exc))
            continue
        if cfg.generation is not None:
            prompts[name] = PromptEncoder(folder, cfg.generation)
        elif cfg.tokenize is not None:
            encoders[name] = TextEncoder(
                folder / cfg.tokenize.tokenizer_file, cfg.tokenize.max_length
            )


async def _main() -> None:
    settings = RouterSettings()
    configure_logging("router", settings.log_level, settings.log_format)
    await serve(settings, stop_event_on_signals(), ready=settle_heap)


if __name__ == "__main__":
    try:
        asyncio.run(_main())
    except RedisRefused as exc:  # what the operator must change: one line, no traceback
        print(f"tiermesh router: cannot start: {exc}", file=sys.stderr)
        sys.exit(1)
