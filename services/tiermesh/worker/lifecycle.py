"""The loops of a worker process together: the batched loop and one per generative unit,
started, and stopped in the worker's two stages (deregister, then stop intake)."""

from __future__ import annotations

import asyncio
import contextlib

import redis.asyncio as aioredis
import structlog
from prometheus_client import CollectorRegistry

from tiermesh.batch.store import BatchStore
from tiermesh.core.control_watch import ControlWatch
from tiermesh.core.repository import ModelRepository
from tiermesh.core.serving import worker_units
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.generation import GenerationTimers, GenerationWorker
from tiermesh.worker.handoff import Handoff
from tiermesh.worker.lanes import ComputePlan
from tiermesh.worker.loop import Worker
from tiermesh.worker.metrics import GenerationMetrics, WorkerMetrics
from tiermesh.worker.opening import Opener
from tiermesh.worker.streams import StreamClient
from tiermesh.worker.units import UnitControl

log = structlog.get_logger("tiermesh.worker")
# Generative models are served on this tier only (they have no tiers of their own).
GENERATION_TIER = "center"


class Loops:
    """Owns the task that runs `worker` and `generators`; the first loop to fail stops them
    all, and the task ends with its error."""

    def __init__(
        self,
        worker: Worker,
        generators: list[GenerationWorker],
        compute: ComputePlan,
    ) -> None:
        self.worker = worker
        self.generators = generators
        # The batched loop's lanes and threads per lane.
        self.compute = compute
        self.task: asyncio.Task[None] | None = None

    @classmethod
    def open(
        cls,
        settings: WorkerSettings,
        names: list[str],
        repo: ModelRepository,
        redis: aioredis.Redis,
        watch: ControlWatch,
        streams: StreamClient,
        handoff: Handoff,
        telemetry: Telemetry,
        registry: CollectorRegistry,
    ) -> Loops:
        """The worker's loops as its settings say, each unit's session opened (blocking):
        one per (version, variant) of the models `names` that model control (`watch`, read
        once) has not unloaded, so a request naming an older version is computed by that
        version's weights. Generative units only on the center tier of an online worker."""
        served = worker_units(repo.configs, names, watch.state.unloaded)
        opener = Opener(settings, repo, registry)
        generative = (
            worker_units(repo.configs, names, watch.state.unloaded, generative=True)
            if settings.worker_tier == GENERATION_TIER and settings.worker_online
            else {}
        )
        opened = opener.generatives(generative)
        metrics = WorkerMetrics(registry)
        # Generative units' providers here; batched units' as the loop opens them (Worker.open).
        for unit, gen in opened.items():
            metrics.session_provider(unit, settings.worker_tier, gen.provider)
        background = (
            BackgroundResults(BatchStore(redis, settings.batch_retention_s), served)
            if settings.batch_jobs
            else None
        )
        worker = Worker(
            tier=settings.worker_tier,
            configs=served,
            runners=opener.runners(served),
            streams=streams,
            handoff=handoff,
            telemetry=telemetry,
            poll_block_ms=settings.poll_block_ms,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            heartbeat_ttl_ms=settings.heartbeat_ttl_ms,
            metrics=metrics,
            reclaim_interval_ms=settings.reclaim_interval_ms,
            reclaim_min_idle_ms=settings.reclaim_min_idle_ms,
            max_deliveries=settings.max_deliveries,
            # Empty names: every model, including ones added to the folder later.
            control=UnitControl(
                watch, repo, settings.model_names, opener, settings.model_control_refresh_ms / 1000
            ),
            background=background,
            background_share=settings.batch_background_share,
            background_target_wait_ms=settings.batch_target_wait_ms,
            online=settings.worker_online,
            lanes=opener.compute.lanes,
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
                streams=streams,
                handoff=handoff,
                timers=GenerationTimers.from_settings(settings),
                metrics=gen_metrics,
                tracer=telemetry.tracer,
                provider=gen.provider,
            )
            for unit, gen in opened.items()
        ]
        return cls(worker, generators, opener.compute)

    async def start(self) -> asyncio.Task[None]:
        """Start the loops; return their task once every loop opened (its units' consumer
        groups made, the first heartbeat sent). Raises why a loop could not start."""
        self.task = task = asyncio.create_task(self._run_all(), name="worker-loop")
        started = asyncio.create_task(self._all_started(), name="worker-started")
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            started.cancel()
            await task  # raises why the worker could not start
        return task

    async def drain(self, leave_window_s: float, grace_s: float) -> None:
        """The worker's stage 1, after its health went NOT_SERVING: deregister, keep reading
        what routers sent until now for `leave_window_s`, then stop intake and finish what
        was read within `grace_s`. Raises the loops' error where one failed."""
        assert self.task is not None
        await self.worker.leave()
        for gen_worker in self.generators:
            await gen_worker.leave()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), leave_window_s)
        self.worker.stop()
        for gen_worker in self.generators:
            gen_worker.stop()
        try:
            await asyncio.wait_for(self.task, grace_s)
        except TimeoutError:
            log.warning("drain grace passed; unfinished entries stay pending")

    def counters(self) -> dict[str, object]:
        """What the worker says as it stops."""
        worker = self.worker
        return {
            "computed_rows": worker.computed_rows,
            "inline_batches": worker.inline_batches,
            "expired": worker.expired,
            "cancelled": worker.cancelled,
            "cascaded": worker.cascaded,
            "reclaimed": worker.reclaimed,
            "dead_lettered": worker.dead_lettered,
        }

    async def _run_all(self) -> None:
        tasks = [
            asyncio.create_task(self.worker.run(), name="batched-loop"),
            *(asyncio.create_task(g.run(), name=f"generation-{g.unit}") for g in self.generators),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _all_started(self) -> None:
        for event in [self.worker.started, *(g.started for g in self.generators)]:
            await event.wait()
