"""The worker's intake: stream entries read into one buffer per stream, and what is dropped
before compute (expired requests, those whose caller left). Reads cover every stream at
once; the decisions (how long to wait, how much to take) are the scheduler's."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

import structlog

from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.keys import StreamKey
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.wire import decode_job
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.batching import QueuedJob, split_cancelled, split_expired, take_count, view_of
from tiermesh.worker.metrics import WorkerMetrics
from tiermesh.worker.scheduler import Scheduler, StreamView, is_background
from tiermesh.worker.served import ServedUnits
from tiermesh.worker.spans import skipped_span
from tiermesh.worker.streams import STREAM_ERRORS, Entry, StreamRead, WorkStreams

log = structlog.get_logger("tiermesh.worker")
# How often a batch that is not yet full looks for more entries while it waits.
FILL_POLL_MS = 0.5
# While a paced background batch is still being written, reads block at most this long.
PACE_POLL_MS = 5
# Entries read per stream when taking back this consumer's own pending ones at start.
PENDING_READ_COUNT = 10_000
JOB_FIELD = keys.JOB_FIELD.encode()


class Intake:
    """Owns the buffers: entries read and neither computed nor dropped yet. The loop calls
    it between batches, so nothing here runs concurrently with itself."""

    def __init__(
        self,
        *,
        streams: WorkStreams,
        units: ServedUnits,
        scheduler: Scheduler,
        clock_ns: Callable[[], int],
        sleep: Callable[[float], Awaitable[None]],
        telemetry: Telemetry,
        metrics: WorkerMetrics | None,
        background: BackgroundResults | None,
        poll_block_ms: int,
        stopping: asyncio.Event,
    ) -> None:
        self._streams = streams
        self._units = units
        self._scheduler = scheduler
        self._clock_ns = clock_ns
        self._sleep = sleep
        self._telemetry = telemetry
        self._metrics = metrics
        self._background = background
        self._poll_block_ms = poll_block_ms
        self._stopping = stopping
        self.buffer: dict[StreamKey, list[QueuedJob]] = defaultdict(list)
        # Request ids of online entries buffered at the last `read_new`, whose cancel flags
        # that read found clear (read in its round trip): a batch of them needs no read.
        self._checked: set[str] = set()
        self.expired = 0
        self.cancelled = 0

    # -- the buffers ----------------------------------------------------------------------

    def buffered(self) -> bool:
        return any(self.buffer.values())

    def online_buffered(self) -> bool:
        """Whether online (not batch-job) entries are buffered."""
        return any(q for k, q in self.buffer.items() if not is_background(k))

    def buffered_for(self, unit: ComputeUnit) -> bool:
        return any(q for k, q in self.buffer.items() if k.unit == unit)

    def views(self) -> list[StreamView]:
        """What the scheduler picks from: one view per stream with entries buffered."""
        return [view_of(k, q) for k, q in self.buffer.items() if q]

    def view(self, key: StreamKey) -> StreamView:
        """The view of one stream with entries buffered."""
        return view_of(key, self.buffer[key])

    def room(self, key: StreamKey) -> int:
        """Rows a stream's buffer may still take: two batches' worth, no more, so unread
        work stays in Redis where other workers can take it (and its wait shows in the
        queue the gateways' limits read); a batch cut while a higher level has traffic
        (Scheduler.row_cap) counts at its cut size. None once it holds two batches' byte
        budgets (a read may still bring that much again: it counts entries)."""
        return self._room(key, self._batch_rows(key))

    def _room(self, key: StreamKey, batch_rows: int) -> int:
        """`room`, for a batch of `batch_rows` rows (`_batch_rows`, worked out once a read)."""
        queued = self.buffer[key]
        budget = self._scheduler.max_batch_bytes
        if budget and sum(q.size for q in queued) >= 2 * budget:
            return 0
        return 2 * batch_rows - sum(q.job.rows for q in queued)

    def _batch_rows(self, key: StreamKey) -> int:
        """The most rows a batch of this stream takes now (cut or not)."""
        rows = self._units.configs[key.unit].bucket(key.bucket).max_batch_size
        if is_background(key):
            return rows
        return min(rows, self._scheduler.row_cap(key, self._clock_ns()))

    def _reads(self) -> list[StreamRead]:
        """The XREADGROUPs of one read, over every stream with room. One counts the same for
        every stream it reads: the streams whose batches are cut read apart (in the same
        round trip), by their room, or they would take the uncut streams' count, and their
        buffers would hold many cut batches' wait (measured: 1.4-1.8 s at p99 beside a
        priority-1 trickle)."""
        cut: dict[int, list[StreamKey]] = defaultdict(list)
        uncut: dict[StreamKey, int] = {}
        for key in self._units.keys:
            rows = self._batch_rows(key)
            room = self._room(key, rows)
            if room <= 0:
                continue
            if rows < self._units.configs[key.unit].bucket(key.bucket).max_batch_size:
                cut[room].append(key)
            else:
                uncut[key] = room
        reads = [StreamRead(list(uncut), max(uncut.values()))] if uncut else []
        return reads + [StreamRead(keys_, room) for room, keys_ in sorted(cut.items())]

    def take(self, key: StreamKey, rows: int) -> list[QueuedJob]:
        """The next batch of this stream: whole requests, in order, up to `rows` rows and
        the scheduler's byte budget (at least one request), out of its buffer."""
        queued = self.buffer[key]
        n = take_count(
            [q.job.rows for q in queued],
            rows,
            [q.size for q in queued],
            self._scheduler.max_batch_bytes,
        )
        batch, self.buffer[key] = queued[:n], queued[n:]
        return batch

    def forget(self, unit: ComputeUnit) -> None:
        """Drop a retired unit's (empty) buffers."""
        for key in [k for k in self.buffer if k.unit == unit]:
            del self.buffer[key]

    # -- reading ---------------------------------------------------------------------------

    async def read_pending(self) -> None:
        """Take back this consumer's own unacknowledged entries (read before a restart)."""
        keys_ = self._units.keys
        await self.collect(await self._streams.read(keys_, PENDING_READ_COUNT, None, pending=True))

    async def read_new(self) -> None:
        """One read of new entries over every stream with room (one XREADGROUP), blocking
        as long as `block_ms` allows. In the same round trip it reads the cancel flags of
        the online entries buffered already (the next batch is mostly theirs under load):
        those whose caller left are dropped now, the others need no read of their own
        before or while they compute (`skip`, `left_meanwhile`)."""
        check = [
            q.job.request_id for k, qs in self.buffer.items() if not is_background(k) for q in qs
        ]
        entries, gone = await self._read_any(self.block_ms(), check)
        self._checked = set(check) - gone
        if gone:
            for key, queued in self.buffer.items():
                live, left = split_cancelled(queued, gone)
                if left:
                    self.buffer[key] = live
                    await self._drop(key, left, "cancelled")
        await self.collect(entries)

    def block_ms(self) -> int | None:
        """How long the next read may block: while idle, the poll; while online work is
        buffered, not at all (just look for newer, maybe more urgent work); while only
        paced background work is (scheduler.background_wait_ms), until its pause ends."""
        if not self.buffered():
            return self._poll_block_ms
        if self.online_buffered():
            return None
        wait = self._scheduler.background_wait_ms(self._clock_ns())
        if wait <= 0:
            return None
        wait = PACE_POLL_MS if math.isinf(wait) else math.ceil(wait)
        return max(1, min(self._poll_block_ms, wait))  # BLOCK 0 would block for ever

    async def _read_any(
        self, block_ms: int | None, check: Sequence[str]
    ) -> tuple[list[Entry], set[str]]:
        """(entries read, the ids among `check` whose callers left)."""
        reads = self._reads()
        if not reads and not check:
            if block_ms:  # nothing to read (every unit unloaded, or paced): idle, not spinning
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), block_ms / 1000)
            return [], set()
        try:
            return await self._streams.read_checking(reads, block_ms, check)
        except STREAM_ERRORS as exc:
            log.warning("redis read failed; retrying", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), 1.0)
            return [], set()

    async def fill(self, key: StreamKey) -> None:
        """Wait for more entries of this stream until the scheduler closes the batch.

        Redis times out a blocked read only on its server tick (100 ms at the default
        hz 10), far coarser than a batch wait of a few ms, so this polls without BLOCK.
        """
        while not self._stopping.is_set() and key.unit not in self._units.closing:
            wait = self._scheduler.wait_ms(self.view(key), self._clock_ns())
            room = self.room(key)
            if wait <= 0 or room <= 0:
                return
            try:
                more = await self._streams.read([key], room, None)
            except STREAM_ERRORS:
                return
            if more:
                await self.collect(more)
            else:
                await self._sleep(min(wait, FILL_POLL_MS) / 1000)

    async def collect(self, entries: Sequence[Entry]) -> None:
        """Buffer what was read, stamped as dequeued now (reclaimed entries come here too).
        The longest queue wait among the online ones goes to the scheduler: background work
        paces itself from it (Scheduler.background_wait_ms)."""
        now = self._clock_ns()
        online_wait = -1
        for e in entries:
            try:
                raw = e.fields[JOB_FIELD]
                job = decode_job(raw)
            except Exception:
                # Undecodable entries can never succeed: drop them rather than loop on them.
                log.error("undecodable stream entry dropped", stream=e.stream.name, id=e.entry_id)
                await self._streams.done(e.stream, [e.entry_id])
                continue
            job = job.with_(timing=job.timing.with_(dequeued_ns=now))
            self.buffer[e.stream].append(QueuedJob(e.stream, e.entry_id, job, now, len(raw)))
            self._scheduler.arrived(e.stream, job.rows, now)
            if not is_background(e.stream) and job.timing.enqueued_ns:
                online_wait = max(online_wait, now - job.timing.enqueued_ns)
        if online_wait >= 0:
            self._scheduler.online_waited(online_wait)

    # -- dropping --------------------------------------------------------------------------

    async def sweep_expired(self) -> None:
        """Drop buffered entries whose deadline has passed, before they count for aging or
        a batch. Their callers were answered DEADLINE_EXCEEDED by their gateway already."""
        now = self._clock_ns()
        for key, queued in self.buffer.items():
            live, expired = split_expired(queued, now)
            if expired:
                self.buffer[key] = live
                await self._drop(key, expired, "expired")

    async def skip(
        self, key: StreamKey, batch: list[QueuedJob], cancelled_too: bool = True
    ) -> list[QueuedJob]:
        """The requests of a batch about to compute that must be: expired ones and (with
        `cancelled_too`) those whose caller left (one look at the cancel flags for the
        batch) are dropped. Nobody waits for their answer (the gateway answered the expired
        ones itself), so they are acknowledged at once and never handed off."""
        live, expired = split_expired(batch, self._clock_ns())
        gone = await self._gone(self._unchecked(live)) if cancelled_too else set()
        live, cancelled = split_cancelled(live, gone)
        if self._background is not None and is_background(key):
            try:
                live, dropped = await self._background.split_cancelled(live)
                cancelled += dropped
            except STREAM_ERRORS:
                pass  # computed; the job refuses the results if it was cancelled
        await self._drop(key, expired, "expired")
        await self._drop(key, cancelled, "cancelled")
        return live

    async def left_meanwhile(self, key: StreamKey, batch: list[QueuedJob]) -> set[str]:
        """For a batch computing while its cancel flags are read: the request ids whose
        caller left, dropped (acknowledged at once, never handed off) as `skip` does."""
        gone = await self._gone(self._unchecked(batch))
        await self._drop(key, split_cancelled(batch, gone)[1], "cancelled")
        return gone

    def _unchecked(self, batch: list[QueuedJob]) -> list[QueuedJob]:
        """The requests of `batch` whose cancel flags the last read did not read."""
        return [q for q in batch if q.job.request_id not in self._checked]

    async def _gone(self, batch: list[QueuedJob]) -> set[str]:
        """The request ids of `batch` whose caller left (one read of their cancel flags);
        none when Redis cannot say (they are computed, and their gateway drops the answer)."""
        if not batch:
            return set()
        try:
            return await self._streams.cancelled([q.job.request_id for q in batch])
        except STREAM_ERRORS:
            return set()

    async def _drop(self, key: StreamKey, queued: list[QueuedJob], reason: str) -> None:
        if not queued:
            return
        if reason == "expired":
            self.expired += len(queued)
        else:
            self.cancelled += len(queued)
        if self._metrics is not None:
            self._metrics.skip(key, reason, len(queued))
        for q in queued:
            skipped_span(self._telemetry, q, reason)
        try:
            await self._streams.done(key, [q.entry_id for q in queued])
        except STREAM_ERRORS:
            log.warning("could not drop skipped entries; they come back", stream=key.name)
