"""Results on their way to postprocess or their gateways (worker/handoff.py), each stream
entry acknowledged after the result it stands for was handed off (publish, then ack).
`BatchOutbox`: the batched loop's, one hand-off and one acknowledgement per computed batch.
`Outbox`: the generative loop's, whose requests post pieces, answers and plain
acknowledgements at any time, sent in order."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable

import grpc
import structlog

from tiermesh.core.jobs import JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.worker.background import BackgroundResults
from tiermesh.worker.batching import QueuedJob
from tiermesh.worker.handoff import Handoff, retrying
from tiermesh.worker.scheduler import Scheduler, is_background
from tiermesh.worker.streams import STREAM_ERRORS, Entry, WorkStreams
from tiermesh.worker.unwritten import Unwritten

log = structlog.get_logger("tiermesh.worker")
# Hand-offs in flight per compute lane, plus one: the next batch computes while the last
# one is delivered.
MAX_HANDOFFS_IN_FLIGHT = 2
# Weight of the newest batch in a stream's measured drain rate.
RATE_ALPHA = 0.3


class BatchOutbox:
    """Owns the hand-off tasks of computed batches: each hands its results on (handoff.py;
    batch-job results go into their job instead, worker/background.py), then acknowledges
    the batch's entries with one `done`, in a task of its own that stopping never cancels
    (the loop awaits them all in `drain`). A slot is taken per batch before it computes
    (`reserve`), so at most `in_flight` batches (MAX_HANDOFFS_IN_FLIGHT with one compute
    lane, one more than the lanes with several) are computed and not yet handed off."""

    def __init__(
        self,
        *,
        streams: WorkStreams,
        handoff: Handoff,
        scheduler: Scheduler,
        clock_ns: Callable[[], int],
        background: BackgroundResults | None,
        in_flight: int = MAX_HANDOFFS_IN_FLIGHT,
        unwritten: Unwritten | None = None,
    ) -> None:
        self._streams = streams
        self._unwritten = unwritten or Unwritten()
        self._handoff = handoff
        self._scheduler = scheduler
        self._clock_ns = clock_ns
        self._background = background
        self._finishing: set[asyncio.Task[None]] = set()
        self._unstarted: set[asyncio.Task[None]] = set()  # not yet at their hand-off
        self._slots = asyncio.Semaphore(in_flight)
        self._rates: dict[StreamKey, float] = {}
        self._last_dispatch: dict[StreamKey, int] = {}

    def interval(self, key: StreamKey, batch: list[QueuedJob], started: int) -> int:
        """Called as a batch is dispatched at `started`: how long it waited for its turn
        since the stream's previous batch (not counting time the stream sat idle), for the
        drain rate."""
        arrived = min(q.queued_ns for q in batch) if batch else started
        interval = started - max(self._last_dispatch.get(key, started), arrived)
        self._last_dispatch[key] = started
        return interval

    @property
    def in_flight(self) -> int:
        """Hand-offs sent and not yet finished."""
        return len(self._finishing)

    @property
    def unsent(self) -> int:
        """Hand-offs whose batch is not on the wire yet: their task has not run, or their
        message waits for (or is in) its stream's write. The others only wait for a reply
        and an ack, which need nothing of the loop for a while."""
        return len(self._unstarted) + self._handoff.unsent

    async def reserve(self, background: bool) -> None:
        """Wait for a hand-off slot for the batch about to compute (a background batch
        counts for pacing from now on). Pair with `release`, or `send`, which releases."""
        await self._slots.acquire()
        if background:
            self._scheduler.background_started()

    def release(self, background: bool) -> None:
        """A dispatched batch is done with: its hand-off slot is free, and a background
        batch no longer counts as in flight for pacing."""
        self._slots.release()
        if background:
            self._scheduler.background_done()

    def send(
        self,
        key: StreamKey,
        batch: list[QueuedJob],
        done: list[JobResult],
        started: int,
        interval: int,
    ) -> None:
        """Hand off `done` then acknowledge `batch`, in a task; its slot (and, for
        background work, pacing) is freed once the results are handed off or written (or
        given up)."""
        background = is_background(key)
        task = asyncio.create_task(
            self._finish(key, batch, done, started, interval), name="worker-handoff"
        )
        self._finishing.add(task)
        self._unstarted.add(task)
        task.add_done_callback(lambda t: self._finished(t, background))

    async def drain(self) -> None:
        """Returns once every hand-off sent so far is finished (handed off and acknowledged,
        or given up)."""
        await asyncio.gather(*self._finishing, return_exceptions=True)

    def _finished(self, task: asyncio.Task[None], background: bool) -> None:
        self._finishing.discard(task)
        self._unstarted.discard(task)
        self.release(background)
        if not task.cancelled() and task.exception() is not None:
            log.error("hand-off task failed", error=repr(task.exception()))

    async def _finish(
        self,
        key: StreamKey,
        batch: list[QueuedJob],
        done: list[JobResult],
        started: int,
        interval: int,
    ) -> None:
        """Publish, then ack: entries are deleted only after the next hop took the batch.
        When the hand-off keeps failing they stay pending for recovery. (With nothing to
        hand off - every request cascaded to another tier - it only acknowledges.)"""
        task = asyncio.current_task()
        if task is not None:
            self._unstarted.discard(task)  # its message is queued by the call below
        # Computed: from now until acknowledged, a return of these entries is no poison.
        entry_ids = [q.entry_id for q in batch]
        self._unwritten.add(key, entry_ids)
        background = self._background
        if background is not None and is_background(key):
            # Written once all the same when computed again after Redis stayed away.
            if not await retrying(
                lambda: background.write(done), STREAM_ERRORS, "batch results not written"
            ):
                log.error("batch results gave up; entries stay pending", stream=key.name)
                return
        elif done and not await retrying(
            lambda: self._handoff.process(done), (grpc.aio.AioRpcError,), "hand-off failed"
        ):
            log.error("hand-off gave up; entries stay pending", stream=key.name, n=len(batch))
            return
        rate = self._drain_rate(key, len(batch), max(self._clock_ns() - started, interval))
        try:
            await self._streams.done(key, entry_ids, rate)
        except STREAM_ERRORS:
            log.error("ack failed; entries will be delivered again", stream=key.name)
        else:
            self._unwritten.forget(key, entry_ids)

    def _drain_rate(self, key: StreamKey, entries: int, period_ns: int) -> float:
        """Entries per second this stream drains at (EWMA), for admission. The period is the
        batch's own service time or, when the stream waited its turn behind others, the time
        since its previous batch: what a newcomer to this queue really sees."""
        rate = entries / max(period_ns / 1e9, 1e-6)
        old = self._rates.get(key)
        self._rates[key] = rate if old is None else RATE_ALPHA * rate + (1 - RATE_ALPHA) * old
        return self._rates[key]


class Outbox:
    """`run` sends: one hand-off at a time, each taking everything posted meanwhile (the
    pieces of a whole engine step travel as one batch). After `close`, `run` returns once
    everything posted is sent."""

    def __init__(self, handoff: Handoff, streams: WorkStreams) -> None:
        self._handoff = handoff
        self._streams = streams
        # (result or None, entry to acknowledge after it or None), in posting order
        self._queue: list[tuple[JobResult | None, Entry | None]] = []
        self._mail = asyncio.Event()
        self._closed = False

    def post(self, result: JobResult, entry: Entry | None = None) -> None:
        """Queue a result; `entry` (a final answer's) is acknowledged once it was handed
        off. Results go in the order they were posted."""
        self._queue.append((result, entry))
        self._mail.set()

    def ack(self, entry: Entry) -> None:
        """Acknowledge an entry nobody waits an answer for, after what was posted before."""
        self._queue.append((None, entry))
        self._mail.set()

    def close(self) -> None:
        self._closed = True
        self._mail.set()

    async def run(self) -> None:
        while True:
            if not self._closed:
                await self._mail.wait()
            self._mail.clear()
            await asyncio.sleep(0)  # every request of the step posts its piece first
            batch, self._queue = self._queue, []
            if batch:
                await self._send(batch)
            elif self._closed:
                return

    async def _send(self, batch: list[tuple[JobResult | None, Entry | None]]) -> None:
        results = [r for r, _ in batch if r is not None]
        entries = [e for _, e in batch if e is not None]
        if results and not await retrying(
            lambda: self._handoff.process(results), (grpc.aio.AioRpcError,), "hand-off failed"
        ):
            log.error("hand-off gave up; entries stay pending", n=len(entries))
            return
        by_stream: dict[StreamKey, list[str]] = defaultdict(list)
        for entry in entries:
            by_stream[entry.stream].append(entry.entry_id)
        for stream, ids in by_stream.items():
            try:
                await self._streams.done(stream, ids)
            except STREAM_ERRORS:
                log.error("ack failed; entries will be delivered again", stream=stream.name)
