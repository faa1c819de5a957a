"""The asyncio side of generation: callers submit requests and read their tokens as they are
produced, while one task owns the engine and runs its steps off the event loop.

The engine is not thread-safe, so it is touched in one place only: `run` applies the
submissions and cancellations that arrived since the last step, on the loop, and then runs
the step in a thread (`asyncio.to_thread`), during which nothing else touches it. Each
request's events go to its own queue; its `Stream` yields tokens until the engine says done
(or rejected), then holds the request's timings (`GenTimings`: time to first token, time per
output token, counts).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog

from tiermesh.generate.engine import Engine, Event
from tiermesh.generate.scheduler import GenRequest

NS_PER_MS = 1_000_000
log = structlog.get_logger("tiermesh.generate")


@dataclass(frozen=True)
class GenTimings:
    """One finished request: `ttft_ms` from submission to its first token, `tpot_ms` the mean
    time between its later tokens (0 with one token), how it ended."""

    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float
    tpot_ms: float
    end: str  # stop, length, deadline, cancelled, error; or rejected:<reason>


def timings(prompt_tokens: int, submitted_ns: int, token_ns: list[int], end: str) -> GenTimings:
    """GenTimings from the instants a request's tokens were produced (pure)."""
    ttft = (token_ns[0] - submitted_ns) / NS_PER_MS if token_ns else 0.0
    tpot = (
        (token_ns[-1] - token_ns[0]) / NS_PER_MS / (len(token_ns) - 1) if len(token_ns) > 1 else 0.0
    )
    return GenTimings(prompt_tokens, len(token_ns), ttft, tpot, end)


class Stream:
    """The tokens of one request as they come; `timings` once it has ended."""

    def __init__(self, service: GenerationService, request: GenRequest, submitted_ns: int) -> None:
        self.request_id = request.request_id
        self._service = service
        self._prompt_tokens = len(request.prompt)
        self._submitted_ns = submitted_ns
        self._events: asyncio.Queue[tuple[Event, int]] = asyncio.Queue()
        self._token_ns: list[int] = []
        self.timings: GenTimings | None = None

    def _put(self, event: Event, at_ns: int) -> None:
        self._events.put_nowait((event, at_ns))

    async def __aiter__(self) -> AsyncIterator[int]:
        while self.timings is None:
            event, at_ns = await self._events.get()
            if self.timings is not None:
                break  # cancelled meanwhile (cancel wakes a reader waiting here)
            if event.kind == "token":
                assert isinstance(event.value, int)
                self._token_ns.append(at_ns)
                yield event.value
            else:
                end = str(event.value) if event.kind == "done" else f"rejected:{event.value}"
                self._finish(end)

    def _finish(self, end: str) -> None:
        self.timings = timings(self._prompt_tokens, self._submitted_ns, self._token_ns, end)

    def cancel(self) -> None:
        """The caller left: the engine frees the request's slot and cache before its next
        step; the stream ends."""
        self._service._cancel(self.request_id)
        if self.timings is None:
            self._finish("cancelled")
            self._events.put_nowait((Event(self.request_id, "done", "cancelled"), 0))


class GenerationService:
    """Owns one engine; `run` until `stop`."""

    def __init__(self, engine: Engine, clock_ns: Callable[[], int] = time.time_ns) -> None:
        self._engine = engine
        self._clock_ns = clock_ns
        self._streams: dict[str, Stream] = {}
        self._incoming: list[GenRequest] = []
        self._cancelled: list[str] = []
        self._wake = asyncio.Event()
        self._stopping = False
        # The engine's load as of its last step (read on the loop, between steps).
        self.running = 0
        self.reserved_tokens = 0

    def submit(self, request: GenRequest) -> Stream:
        """Queue a request (ValueError for an id in use); read its tokens from the stream."""
        if request.request_id in self._streams:
            raise ValueError(f"request {request.request_id!r} already running")
        stream = Stream(self, request, self._clock_ns())
        self._streams[request.request_id] = stream
        self._incoming.append(request)
        self._wake.set()
        return stream

    def _cancel(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._cancelled.append(request_id)
            self._wake.set()

    def _measure(self) -> None:
        self.running = len(self._engine.running)
        self.reserved_tokens = self._engine.reserved_tokens

    def _fail_all(self) -> list[Event]:
        """A step raised (onnxruntime refused a run): which request caused it is unknown, so
        every request in the engine ends with "error" (no retry could help them all) and
        the engine starts clean for the ones that come next."""
        log.exception("generation step failed; its requests end with an error")
        failed = [*self._engine.running, *self._engine.waiting]
        for request_id in failed:
            self._engine.cancel(request_id)
        return [Event(request_id, "done", "error") for request_id in failed]

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Step the engine while it has work; sleep on an event while it has none."""
        while not self._stopping:
            for request in self._incoming:
                self._engine.submit(request)
            self._incoming.clear()
            for request_id in self._cancelled:
                self._engine.cancel(request_id)
            self._cancelled.clear()
            self._measure()
            if self._engine.idle():
                self._wake.clear()
                if not self._incoming and not self._cancelled:
                    await self._wake.wait()
                continue
            try:
                events = await asyncio.to_thread(self._engine.step)
            except Exception:
                events = self._fail_all()
            at_ns = self._clock_ns()
            self._measure()
            for event in events:
                stream = self._streams.get(event.request_id)
                if stream is None:
                    continue  # cancelled meanwhile
                stream._put(event, at_ns)
                if event.kind != "token":
                    del self._streams[event.request_id]
