"""bench runner loops, driven by fake senders on a fake clock (no network, no sleeps)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from tiermesh.bench import runner
from tiermesh.bench.records import NOT_SENT, OK, Outcome, Record
from tiermesh.bench.workload import InputSpec, RequestSpec, Workload

INPUTS = [InputSpec("INPUT0", "FP32", (-1, 4))]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


async def test_closed_loop_stops_at_the_request_limit() -> None:
    clock = Clock()
    seen: list[int] = []

    async def send(spec: RequestSpec) -> Outcome:
        seen.append(spec.index)
        clock.now += 0.001
        return Outcome(OK, 1.0)

    recorder = runner.RunRecorder(clock=clock)
    await runner.closed_loop(
        send, Workload(INPUTS, 0), recorder, concurrency=4, limit=10, until=1e9
    )
    assert len(recorder.records) == 10
    assert sorted(seen) == list(range(10))
    assert recorder.in_flight == 0


async def test_closed_loop_stops_starting_at_the_deadline_and_keeps_concurrency() -> None:
    clock = Clock()
    gate = asyncio.Event()
    peak = 0
    recorder = runner.RunRecorder(clock=clock)

    async def send(spec: RequestSpec) -> Outcome:
        nonlocal peak
        peak = max(peak, recorder.in_flight)
        if recorder.in_flight == 3:
            gate.set()
        await gate.wait()
        clock.now += 0.5
        return Outcome(OK, 500.0)

    await runner.closed_loop(
        send, Workload(INPUTS, 0), recorder, concurrency=3, limit=1000, until=2.0
    )
    assert peak == 3
    # Three callers start at 0; each finish moves the clock 0.5 s; nothing starts at >= 2.
    assert all(r.start_s < 2.0 for r in recorder.records)
    assert 3 <= len(recorder.records) < 10
    assert {r.concurrency for r in recorder.records} == {3}


async def test_halt_stops_new_requests() -> None:
    recorder = runner.RunRecorder()

    async def send(spec: RequestSpec) -> Outcome:
        if spec.index == 4:
            recorder.halt()
        return Outcome(OK, 1.0)

    await runner.closed_loop(
        send, Workload(INPUTS, 0), recorder, concurrency=1, limit=100, until=1e18
    )
    assert len(recorder.records) == 5


async def test_open_loop_sends_on_schedule_and_counts_what_the_cap_refuses() -> None:
    clock = Clock()
    release = asyncio.Event()
    refused: list[float] = []

    async def send(spec: RequestSpec) -> Outcome:
        await release.wait()
        return Outcome(OK, 2.0)

    def on_record(record: Record) -> None:
        # The two sent requests stay in flight until the last three arrivals are refused.
        if record.outcome.code == NOT_SENT:
            refused.append(record.start_s)
            if len(refused) == 3:
                release.set()

    recorder = runner.RunRecorder(clock=clock, on_record=on_record)
    await runner.open_loop(
        send,
        Workload(INPUTS, 0),
        recorder,
        [0.0, 0.1, 0.2, 0.3, 0.4],
        max_in_flight=2,
        sleep=clock.sleep,
    )
    assert refused == pytest.approx([0.2, 0.3, 0.4])
    assert sorted(r.start_s for r in recorder.records if r.ok) == pytest.approx([0.0, 0.1])
    assert all(r.lag_ms == pytest.approx(0.0) for r in recorder.records)
    assert recorder.in_flight == 0


def test_the_recorder_keeps_its_records_out_of_full_collections() -> None:
    recorder = runner.RunRecorder(clock=Clock())
    record = Record(0.0, "16", 1, 0, 0, Outcome(OK, 1.0))
    gc.unfreeze()
    try:
        for _ in range(runner.FREEZE_EVERY - 1):
            recorder.add(Record(0.0, "16", 1, 0, 0, Outcome(OK, 1.0)))
        assert gc.get_freeze_count() == 0
        recorder.add(record)
        # every record kept so far (and what else survived) is out of the collector's walks
        assert gc.get_freeze_count() >= runner.FREEZE_EVERY
    finally:
        gc.unfreeze()
