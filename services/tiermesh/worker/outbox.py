"""Results on their way to postprocess, in order, each stream entry acknowledged after the
result it stands for was handed off (publish, then ack). Used by the generative loop, whose
requests post pieces, answers and plain acknowledgements at any time."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import redis.asyncio as aioredis
import structlog

from tiermesh.core.jobs import JobResult
from tiermesh.core.keys import StreamKey
from tiermesh.worker.handoff import PostprocessClient, retrying
from tiermesh.worker.streams import Entry, StreamClient

log = structlog.get_logger("tiermesh.worker")


class Outbox:
    """`run` sends: one hand-off at a time, each taking everything posted meanwhile (the
    pieces of a whole engine step travel as one batch). After `close`, `run` returns once
    everything posted is sent."""

    def __init__(self, handoff: PostprocessClient, streams: StreamClient) -> None:
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
            except (aioredis.RedisError, OSError):
                log.error("ack failed; entries will be delivered again", stream=stream.name)
