"""Pure batch-formation decisions. No Redis, no gRPC, no clock: callers pass `now`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiermesh.core.jobs import Job
from tiermesh.core.keys import StreamKey


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job read from a stream and not yet acknowledged."""

    stream: StreamKey
    entry_id: str
    job: Job
    dequeued_ns: int


def pick_stream(buffered: Mapping[StreamKey, int]) -> StreamKey | None:
    """The stream to batch from next: the highest priority (lowest level) with entries,
    then the shortest bucket. Weighted priority with aging arrives with the scheduler."""
    ready = [key for key, count in buffered.items() if count > 0]
    if not ready:
        return None
    return min(ready, key=lambda k: (k.priority, k.bucket, k.model))


def wait_more_ms(
    first_dequeued_ns: int, now_ns: int, max_wait_ms: float, rows: int, max_rows: int
) -> float:
    """How much longer to wait for more requests before dispatching; <= 0 means now."""
    if rows >= max_rows:
        return 0.0
    waited_ms = (now_ns - first_dequeued_ns) / 1e6
    return max_wait_ms - waited_ms


def take_count(rows: Sequence[int], max_rows: int) -> int:
    """How many queued jobs (in order) fit in one batch of at most `max_rows` rows; at
    least one when any are queued, so that a job of exactly max_rows rows still runs."""
    total = 0
    for i, n in enumerate(rows):
        if total + n > max_rows and i > 0:
            return i
        total += n
    return len(rows)


def split_expired(
    batch: Sequence[QueuedJob], now_ns: int
) -> tuple[list[QueuedJob], list[QueuedJob]]:
    """(live, expired): a job whose deadline has passed is never computed."""
    live: list[QueuedJob] = []
    expired: list[QueuedJob] = []
    for q in batch:
        (expired if q.job.deadline_ns and q.job.deadline_ns <= now_ns else live).append(q)
    return live, expired
