"""Pure batch-formation decisions. No Redis, no gRPC, no clock: callers pass `now`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tiermesh.core.jobs import Job
from tiermesh.core.keys import StreamKey
from tiermesh.core.message_bytes import count_within
from tiermesh.worker.scheduler import StreamView

# A batch whose requests all waited less than this since they were queued computes while
# their cancel flags are read (a caller seldom leaves that soon, and the read is a Redis
# round trip, ~0.3 ms at concurrency 1 on the reference machine); a batch holding one that
# waited longer reads them first, so what callers left under load is never computed. A
# request already buffered at the step's read had its flags read in that round trip
# (Intake.read_new) and needs no read of its own.
CANCEL_CHECK_FIRST_NS = 10_000_000


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job read from a stream and not yet acknowledged."""

    stream: StreamKey
    entry_id: str
    job: Job
    dequeued_ns: int
    size: int = 0  # bytes of its stream entry's job, as read (its share of the batch budget)

    @property
    def queued_ns(self) -> int:
        """When it was queued: routed, on the router's clock (read, for a job without)."""
        return self.job.timing.routed_ns or self.dequeued_ns


def view_of(key: StreamKey, queued: Sequence[QueuedJob]) -> StreamView:
    """What the scheduler needs to know about one stream's buffered entries (non-empty)."""
    deadlines = [q.job.deadline_ns for q in queued if q.job.deadline_ns]
    return StreamView(
        key=key,
        rows=sum(q.job.rows for q in queued),
        size=sum(q.size for q in queued),
        oldest_enqueued_ns=min(q.queued_ns for q in queued),
        first_dequeued_ns=min(q.dequeued_ns for q in queued),
        earliest_deadline_ns=min(deadlines, default=0),
    )


def take_count(
    rows: Sequence[int], max_rows: int, sizes: Sequence[int] = (), max_bytes: int = 0
) -> int:
    """How many queued jobs (in order) fit in one batch of at most `max_rows` rows and (with
    `max_bytes`) at most `max_bytes` of `sizes`; at least one when any are queued, so that a
    job of exactly max_rows rows, or one over the byte budget, still runs (alone)."""
    total = 0
    n = len(rows)
    for i, r in enumerate(rows):
        if total + r > max_rows and i > 0:
            n = i
            break
        total += r
    return count_within(sizes[:n], max_bytes) if max_bytes and sizes else n


def split_expired(
    batch: Sequence[QueuedJob], now_ns: int
) -> tuple[list[QueuedJob], list[QueuedJob]]:
    """(live, expired): a job whose deadline has passed is never computed."""
    live: list[QueuedJob] = []
    expired: list[QueuedJob] = []
    for q in batch:
        (expired if q.job.deadline_ns and q.job.deadline_ns <= now_ns else live).append(q)
    return live, expired


def split_cancelled(
    batch: Sequence[QueuedJob], cancelled: set[str]
) -> tuple[list[QueuedJob], list[QueuedJob]]:
    """(to compute, cancelled): a request whose caller gave up is not computed."""
    keep = [q for q in batch if q.job.request_id not in cancelled]
    gone = [q for q in batch if q.job.request_id in cancelled]
    return keep, gone


def cancel_check_first(batch: Sequence[QueuedJob], now_ns: int) -> bool:
    """Whether to read the batch's cancel flags before computing it (else meanwhile)."""
    return any(now_ns - q.queued_ns >= CANCEL_CHECK_FIRST_NS for q in batch)
