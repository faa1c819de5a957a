"""What one tenant's batch jobs may hold: unfinished jobs at once, and inputs and bytes per
job. Pure: the Submit door asks `JobBudget` before it stores a chunk (gateway/batch_jobs.py);
the open jobs are counted in Redis, atomically with the job's creation (batch/store.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import grpc

from tiermesh.core.errors import MeshError, exhausted

# A tenant at its open-jobs cap may retry once one of them has ended: not before a second.
OPEN_JOBS_RETRY_AFTER_MS = 1000


@dataclass(frozen=True, slots=True)
class BatchCaps:
    """The defaults are GatewaySettings' (TIERMESH_BATCH_MAX_*); a tenants-file entry's
    `batch:` overrides them for its tenant."""

    max_open_jobs: int = 8
    max_inputs: int = 100_000
    max_bytes: int = 256 << 20

    def overridden(
        self,
        max_open_jobs: int | None = None,
        max_inputs: int | None = None,
        max_bytes: int | None = None,
    ) -> BatchCaps:
        """These caps with each given (not None) one replaced."""
        given = {
            "max_open_jobs": max_open_jobs,
            "max_inputs": max_inputs,
            "max_bytes": max_bytes,
        }
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


def open_jobs_refused(tenant: str, cap: int) -> MeshError:
    """RESOURCE_EXHAUSTED for a Submit of a tenant with `cap` unfinished jobs already."""
    who = f"tenant '{tenant}'" if tenant else "this port's caller"
    return exhausted(
        f"{who} has {cap} unfinished batch jobs, its cap (max_open_jobs); submit again once "
        "one has ended",
        OPEN_JOBS_RETRY_AFTER_MS,
    )


def _added(held: int, more: int, cap: int, unit: str, name: str) -> int:
    """held + more; RESOURCE_EXHAUSTED naming the cap when that crosses it (without a
    retry-after: the same job sent again crosses the same cap)."""
    if held + more > cap:
        raise MeshError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"batch job over its cap of {cap} {unit} ({name}): {held} sent before, {more} more",
        )
    return held + more


class JobBudget:
    """Counts what one Submit has stored. Called before each chunk is stored: `count` with
    the chunk's count before anything of it is built, `store` with each input's encoded
    size; either raises RESOURCE_EXHAUSTED naming the cap the input would cross, so that
    the chunk holding it is never stored."""

    def __init__(self, caps: BatchCaps) -> None:
        self._caps = caps
        self.inputs = 0
        self.bytes = 0

    def count(self, n: int) -> None:
        """`n` more inputs arrive (a chunk's texts and items, before they are read)."""
        self.inputs = _added(self.inputs, n, self._caps.max_inputs, "inputs", "max_inputs")

    def store(self, size: int) -> None:
        """One more input of `size` bytes (encoded, as Redis will hold it)."""
        self.bytes = _added(self.bytes, size, self._caps.max_bytes, "bytes", "max_bytes")
