"""The scenarios' loops. They move requests out and records in; every decision (what to
send, when to stop climbing, what the figures are) lives in the pure modules.

Every loop is bounded by a request count and a deadline; a request in flight at the
deadline finishes (its own timeout bounds it), no new one starts. `RunRecorder.halt()`
(Ctrl-C) stops new requests the same way.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tiermesh.bench import cpu
from tiermesh.bench.ladder import LadderPlan, Step, make_step, stop_reason
from tiermesh.bench.records import NOT_SENT, Outcome, Record
from tiermesh.bench.workload import RequestSpec

Send = Callable[[RequestSpec], Awaitable[Outcome]]
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

# Every this many records the recorder hands what has survived so far to gc.freeze(). The
# records of a run live until it ends, and without this each full collection walks all of
# them: in the 150 s soak (~200k records) the load generator stopped for 0.38-0.49 s every
# 12-20 s, and its open loop then sent the arrivals it had missed in one burst of 500-700
# calls, a load that was not the Poisson one it claimed (and that the mesh's memory echoed).
FREEZE_EVERY = 10_000


class RunRecorder:
    """Collects the records of one run and counts what is in flight. `origin` is the
    clock reading that records' `start_s` count from."""

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        on_record: Callable[[Record], None] | None = None,
    ) -> None:
        self.clock = clock
        self.origin = clock()
        self.records: list[Record] = []
        self.in_flight = 0
        self.halted = False
        self._on_record = on_record

    def now(self) -> float:
        return self.clock() - self.origin

    def halt(self) -> None:
        """No new requests from now on; those in flight finish."""
        self.halted = True

    def add(self, record: Record) -> None:
        self.records.append(record)
        if len(self.records) % FREEZE_EVERY == 0:
            # Young garbage is collected before it gets here; what is frozen is mostly the
            # records themselves, which refcounting still frees when the run is dropped.
            gc.freeze()
        if self._on_record is not None:
            self._on_record(record)

    def call(
        self, send: Send, spec: RequestSpec, step: int, concurrency: int, lag_ms: float = 0.0
    ) -> Coroutine[Any, Any, None]:
        """Counts the request in flight now (before any task runs it) and returns the
        awaitable that sends it and records the outcome."""
        self.in_flight += 1
        return self._finish(send, spec, self.now(), step, concurrency, lag_ms)

    async def _finish(
        self,
        send: Send,
        spec: RequestSpec,
        start_s: float,
        step: int,
        concurrency: int,
        lag_ms: float,
    ) -> None:
        try:
            outcome = await send(spec)
        finally:
            self.in_flight -= 1
        self.add(Record(start_s, spec.length, spec.priority, step, concurrency, outcome, lag_ms))


async def closed_loop(
    send: Send,
    requests: Iterator[RequestSpec],
    recorder: RunRecorder,
    *,
    concurrency: int,
    limit: int,
    until: float,
    step: int = 0,
) -> None:
    """`concurrency` callers, each sending its next request when the last one is answered,
    until `limit` requests were started or the recorder's clock passes `until`."""
    started = 0

    async def caller() -> None:
        nonlocal started
        while started < limit and recorder.clock() < until and not recorder.halted:
            started += 1
            await recorder.call(send, next(requests), step, concurrency)

    async with asyncio.TaskGroup() as group:
        for _ in range(min(concurrency, limit)):
            group.create_task(caller())


async def open_loop(
    send: Send,
    requests: Iterator[RequestSpec],
    recorder: RunRecorder,
    arrivals: Iterable[float],
    *,
    max_in_flight: int,
    sleep: Sleep = asyncio.sleep,
) -> None:
    """Sends one request at each arrival time (seconds from now) whatever happened to
    the others; an arrival that finds `max_in_flight` requests outstanding is recorded as
    NOT_SENT. Returns when every sent request is answered."""
    base = recorder.clock()
    async with asyncio.TaskGroup() as group:
        for at in arrivals:
            if recorder.halted:
                break
            delay = base + at - recorder.clock()
            if delay > 0:
                await sleep(delay)
            spec = next(requests)
            lag_ms = max(0.0, (recorder.clock() - base - at) * 1e3)
            if recorder.in_flight >= max_in_flight:
                recorder.add(
                    Record(
                        recorder.now(),
                        spec.length,
                        spec.priority,
                        0,
                        0,
                        Outcome(NOT_SENT, 0.0),
                        lag_ms,
                    )
                )
                continue
            group.create_task(recorder.call(send, spec, 0, 0, lag_ms))


@dataclass
class LadderResult:
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""


async def ladder(
    send: Send,
    requests: Iterator[RequestSpec],
    recorder: RunRecorder,
    plan: LadderPlan,
    *,
    limit: int,
    until: float,
    on_step: Callable[[int, int], None] | None = None,
) -> LadderResult:
    """Closed-loop steps at rising concurrency until `stop_reason` says so or the run's
    bounds (`limit` requests in all, deadline `until`) are spent."""
    result = LadderResult()
    remaining = limit
    for index, concurrency in enumerate(plan.concurrencies):
        if remaining <= 0 or recorder.clock() >= until or recorder.halted:
            result.stop_reason = "the run's request or time bound was reached"
            break
        if on_step is not None:
            on_step(index, concurrency)
        first = len(recorder.records)
        before = cpu.sample()
        start = recorder.clock()
        await closed_loop(
            send,
            requests,
            recorder,
            concurrency=concurrency,
            limit=min(plan.step_requests, remaining),
            until=min(until, start + plan.step_duration_s),
            step=index,
        )
        wall_s = recorder.clock() - start
        spent = cpu.sample()
        records = recorder.records[first:]
        cpu_s = (spent.user_s + spent.system_s) - (before.user_s + before.system_s)
        result.steps.append(make_step(index, concurrency, records, wall_s, cpu_s))
        remaining -= len(records)
        reason = stop_reason(result.steps, plan)
        if reason is not None:
            result.stop_reason = reason
            break
    else:
        result.stop_reason = "the last step of the ladder was reached"
    return result
