"""What a worker does with batch-job work besides computing it: skip the entries of jobs
cancelled meanwhile, and write results into the job (not to a gateway: no caller waits).
The output step runs here, as postprocess runs it for online answers, so a job's result
equals the online answer for the same input."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import grpc

from tiermesh.batch.plan import CANCELLED
from tiermesh.batch.store import BatchStore
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.controls import Controls
from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.output_steps import OutputSteps
from tiermesh.core.wire import encode_batch_result
from tiermesh.worker.batching import QueuedJob


def job_of(controls: Controls) -> tuple[str, int] | None:
    """(job id, input index) of a batch-job request; None for any other request."""
    return (controls.batch_job, controls.batch_index) if controls.batch_job else None


class BackgroundResults:
    def __init__(self, store: BatchStore, configs: Mapping[ComputeUnit, ModelConfig]) -> None:
        self._store = store
        self.set_units(configs)

    def set_units(self, configs: Mapping[ComputeUnit, ModelConfig]) -> None:
        """Output steps for the models of the units served (keyed by model name)."""
        self._steps = OutputSteps.for_models({c.name: c for c in configs.values()})

    async def split_cancelled(
        self, batch: Sequence[QueuedJob]
    ) -> tuple[list[QueuedJob], list[QueuedJob]]:
        """(to compute, to drop): entries of jobs cancelled (or gone) are not computed."""
        ids = sorted({j[0] for q in batch if (j := job_of(q.job.controls))})
        statuses = await self._store.statuses(ids)
        dead = {i for i in ids if statuses.get(i, CANCELLED) == CANCELLED}
        keep: list[QueuedJob] = []
        drop: list[QueuedJob] = []
        for q in batch:
            j = job_of(q.job.controls)
            (drop if j is None or j[0] in dead else keep).append(q)
        return keep, drop

    async def write(self, results: Sequence[JobResult]) -> int:
        """Write each result into its job once (a redelivered input is not written twice);
        how many were new. Raises Redis errors: the caller then leaves the entries pending."""
        by_job: dict[str, list[tuple[int, bytes, bool]]] = defaultdict(list)
        for r in results:
            j = job_of(r.controls)
            if j is None:
                continue
            r = self._steps.apply(r)
            by_job[j[0]].append((j[1], encode_batch_result(j[1], r), r.code == grpc.StatusCode.OK))
        written = 0
        for job_id, items in by_job.items():
            written += max(await self._store.record(job_id, items), 0)
        return written
