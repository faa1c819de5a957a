"""The loops of a worker process together: the batched loop and one per generative unit,
started, and stopped in the worker's two stages (deregister, then stop intake)."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from tiermesh.worker.generation import GenerationWorker
from tiermesh.worker.loop import Worker

log = structlog.get_logger("tiermesh.worker")


class Loops:
    """Owns the task that runs `worker` and `generators`; the first loop to fail stops them
    all, and the task ends with its error."""

    def __init__(self, worker: Worker, generators: list[GenerationWorker]) -> None:
        self.worker = worker
        self.generators = generators
        self.task: asyncio.Task[None] | None = None

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
