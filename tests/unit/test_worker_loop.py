"""The batched worker's loop, stepped: a real onnxruntime session of the tiny mlp, a real
postprocess delivering to a real Delivery server, an injected clock, and Redis replaced by
an in-memory stream client (the only fake: it lets a test step the loop and see each
stream call it makes). Nothing sleeps: the batch wait passes on the injected clock."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from tests.conftest import MODELS
from tests.integration.conftest import Downstream, downstream  # noqa: F401 (a fixture)
from tiermesh.core import keys
from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.controls import NO_CONTROLS, Controls
from tiermesh.core.jobs import Job, JobResult, Timing
from tiermesh.core.keys import StreamKey
from tiermesh.core.model_config import ModelConfig, parse_config
from tiermesh.core.server import make_channel
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import decode_job, encode_job
from tiermesh.worker.batching import CANCEL_CHECK_FIRST_NS
from tiermesh.worker.handoff import PostprocessClient
from tiermesh.worker.lanes import INLINE_MAX_NS
from tiermesh.worker.loop import Worker
from tiermesh.worker.runner import JobOutputs, ModelRunner
from tiermesh.worker.scheduler import HIGHER_PRESENT_NS
from tiermesh.worker.streams import Entry, StreamRead

UNIT = ComputeUnit("mlp", "1", "fp32")
HIGH = StreamKey(UNIT, "center", 1, 0)
LOW = StreamKey(UNIT, "center", 2, 0)
MS = 1_000_000


class MemoryStreams:
    """WorkStreams over dicts and lists, with one consumer group per stream: entries are
    read once (then pending for their reader until `done` or `dead_letter`), and every
    call is noted in `calls` as (method, stream or None, entry or request ids)."""

    def __init__(self, consumer: str = "w1") -> None:
        self.consumer = consumer
        self._ids = itertools.count(1)
        # stream -> entry id -> fields, in XADD order; unread ids; pending id -> reader
        self.entries: dict[StreamKey, dict[str, dict[bytes, bytes]]] = defaultdict(dict)
        self._unread: dict[StreamKey, list[str]] = defaultdict(list)
        self.pending: dict[StreamKey, dict[str, str]] = defaultdict(dict)
        self._deliveries: dict[str, int] = defaultdict(int)
        self.cancel_flags: set[str] = set()
        self.workers: dict[tuple[str, str], set[str]] = defaultdict(set)
        # (model, tier) -> the execution provider of the model's session, by heartbeat
        self.providers: dict[tuple[str, str], str] = {}
        self.dead: list[tuple[Entry, str]] = []
        self.calls: list[tuple[str, StreamKey | None, tuple[str, ...]]] = []
        # Called with (stream, acknowledged ids) as `done` starts.
        self.on_done: Callable[[StreamKey, Sequence[str]], None] = lambda s, ids: None

    def add(self, stream: StreamKey, job: Job) -> str:
        """XADD: a new entry holding `job`; its id."""
        entry_id = f"{next(self._ids)}-0"
        self.entries[stream][entry_id] = {keys.JOB_FIELD.encode(): encode_job(job)}
        self._unread[stream].append(entry_id)
        return entry_id

    def named(self, method: str) -> list[tuple[StreamKey | None, tuple[str, ...]]]:
        return [(s, ids) for m, s, ids in self.calls if m == method]

    def _note(self, method: str, stream: StreamKey | None = None, ids: Iterable[str] = ()) -> None:
        self.calls.append((method, stream, tuple(ids)))

    def _remove(self, stream: StreamKey, entry_id: str) -> None:
        self.pending[stream].pop(entry_id, None)
        self.entries[stream].pop(entry_id, None)

    async def ensure_groups(self, streams: Iterable[StreamKey]) -> None:
        self._note("ensure_groups")

    async def read(
        self, streams: Sequence[StreamKey], count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]:
        await asyncio.sleep(0)  # as a socket read does: other tasks (compute lanes) go on
        out = []
        for stream in streams:
            if pending:
                mine = [i for i, c in self.pending[stream].items() if c == self.consumer]
                ids = mine[:count]
            else:
                ids, self._unread[stream] = (
                    self._unread[stream][:count],
                    self._unread[stream][count:],
                )
            for entry_id in ids:
                self.pending[stream][entry_id] = self.consumer
                self._deliveries[entry_id] += 1
                out.append(Entry(stream, entry_id, self.entries[stream][entry_id]))
        self._note("read", None, [e.entry_id for e in out])
        return out

    async def read_checking(
        self, reads: Sequence[StreamRead], block_ms: int | None, check: Sequence[str]
    ) -> tuple[list[Entry], set[str]]:
        """`read` of each StreamRead, and the flags of `check` in the same round trip
        (noted as `flags`)."""
        if check:
            self._note("flags", None, check)
        entries = []
        for r in reads:
            entries += await self.read(r.streams, r.count, block_ms)
        return entries, self.cancel_flags & set(check)

    async def done(
        self, stream: StreamKey, entry_ids: Sequence[str], drain_rate: float | None = None
    ) -> None:
        self.on_done(stream, entry_ids)
        self._note("done", stream, entry_ids)
        for entry_id in entry_ids:
            self._remove(stream, entry_id)

    async def reclaim(self, stream: StreamKey, min_idle_ms: int, count: int) -> list[Entry]:
        """Every entry other consumers hold counts as idle long enough."""
        theirs = [i for i, c in self.pending[stream].items() if c != self.consumer][:count]
        for entry_id in theirs:
            self.pending[stream][entry_id] = self.consumer
            self._deliveries[entry_id] += 1
        self._note("reclaim", stream, theirs)
        return [Entry(stream, i, self.entries[stream][i]) for i in theirs]

    async def reclaim_many(
        self, rooms: Mapping[StreamKey, int], min_idle_ms: int
    ) -> dict[StreamKey, list[Entry]]:
        taken = {s: await self.reclaim(s, min_idle_ms, n) for s, n in rooms.items()}
        return {s: entries for s, entries in taken.items() if entries}

    async def deliveries(self, stream: StreamKey, entry_ids: Sequence[str]) -> dict[str, int]:
        self._note("deliveries", stream, entry_ids)
        return {i: self._deliveries[i] for i in entry_ids if i in self.pending[stream]}

    async def dead_letter(self, entry: Entry, reason: str) -> None:
        self._note("dead_letter", entry.stream, [entry.entry_id])
        self.dead.append((entry, reason))
        self._remove(entry.stream, entry.entry_id)

    async def requeue(self, stream: StreamKey, job: bytes, trace_context: dict[str, str]) -> bool:
        self._note("requeue", stream)
        if not self.workers[(stream.unit, stream.tier)]:
            return False
        self.add(stream, decode_job(job))
        return True

    async def cancelled(self, request_ids: Sequence[str]) -> set[str]:
        self._note("cancelled", None, request_ids)
        return self.cancel_flags & set(request_ids)

    async def heartbeat(
        self,
        models: Iterable[str],
        tier: str,
        ttl_ms: int,
        providers: Mapping[str, str] | None = None,
    ) -> None:
        self._note("heartbeat")
        for model in models:
            self.workers[(model, tier)].add(self.consumer)
            if providers and model in providers:
                self.providers[(model, tier)] = providers[model]

    async def leave(self, models: Iterable[str], tier: str) -> None:
        self._note("leave")
        for model in models:
            self.workers[(model, tier)].discard(self.consumer)
            self.providers.pop((model, tier), None)


class Clock:
    """The worker's clock: ns that only move when the worker pauses (`sleep`)."""

    def __init__(self) -> None:
        self.now = time.time_ns()
        self.slept: list[float] = []
        # Called before each pause with the clock as it is (a test adds entries in it).
        self.on_sleep: Callable[[], None] = lambda: None

    def ns(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.on_sleep()
        self.slept.append(seconds)
        self.now += round(seconds * 1e9)


class CountingRunner(ModelRunner):
    """The real runner, noting the request ids of every run it is asked for."""

    def __init__(self, cfg: ModelConfig, path: Path) -> None:
        super().__init__(cfg, path)
        self.runs: list[list[str]] = []
        self.threads: list[int] = []  # the thread of each run
        self.alone: list[bool] = []  # each run was told nothing else computes
        # Each run takes this long on the worker's injected clock (its compute estimate).
        self.clock: Clock | None = None
        self.run_ns = 0

    def run(self, jobs: Sequence[Job], alone: bool = False) -> list[JobOutputs]:
        self.runs.append([j.request_id for j in jobs])
        self.threads.append(threading.get_ident())
        self.alone.append(alone)
        if self.clock is not None:
            self.clock.now += self.run_ns
        return super().run(jobs, alone)


def mlp_config(**changes: Any) -> ModelConfig:
    """The committed mlp config with top-level keys (and batching keys) replaced."""
    raw = yaml.safe_load((MODELS / "mlp" / "config.yaml").read_text())
    raw["batching"] = {**raw.get("batching", {}), **changes.pop("batching", {})}
    return parse_config({**raw, **changes}, "test")


class Harness:
    """One worker over its in-memory streams and clock, with the callers of its requests."""

    def __init__(
        self,
        worker: Worker,
        streams: MemoryStreams,
        clock: Clock,
        runner: CountingRunner,
        down: Downstream,
    ) -> None:
        self.worker, self.streams, self.clock, self.runner = worker, streams, clock, runner
        self._down = down
        self.answers: dict[str, asyncio.Future[JobResult]] = {}
        self.entry_ids: dict[str, str] = {}

    def add(
        self,
        request_id: str,
        stream: StreamKey,
        *,
        width: int = 4,
        deadline_ms: int | None = 60_000,
        controls: Controls = NO_CONTROLS,
    ) -> str:
        """Route a request to `stream` (its caller waits at the Delivery server); its entry.
        Its deadline is `deadline_ms` from now on the worker's clock (None: no deadline)."""
        self.answers[request_id] = self._down.pending.register(request_id)
        entry_id = self.streams.add(
            stream,
            Job(
                request_id=request_id,
                model=stream.unit.model,
                inputs=(from_numpy("INPUT0", np.ones((1, width), np.float32), "FP32"),),
                gateway=self._down.delivery_address,
                deadline_ns=0 if deadline_ms is None else self.clock.now + deadline_ms * MS,
                priority=stream.priority,
                tier=stream.tier,
                timing=Timing(routed_ns=self.clock.now),
                controls=controls,
            ),
        )
        self.entry_ids[request_id] = entry_id
        return entry_id

    async def steps(self, n: int = 1) -> None:
        """`n` turns of the loop, then every hand-off they started finished."""
        for _ in range(n):
            await self.worker.step()
        await self.worker.drain()

    def acked(self) -> list[tuple[StreamKey | None, tuple[str, ...]]]:
        return self.streams.named("done")

    def result(self, request_id: str) -> JobResult:
        return self.answers[request_id].result()


@pytest.fixture
async def make(
    tmp_path: Path,
    downstream: Downstream,  # noqa: F811
) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    """Builds an opened worker (groups made, first heartbeat out) for a config of the mlp."""
    model = tmp_path / "mlp.onnx"
    model.write_bytes(build_mlp())
    telemetry = Telemetry("worker-loop-test")
    channel = make_channel(downstream.postprocess_address)

    async def build(
        cfg: ModelConfig | None = None,
        tier: str = "center",
        lanes: int = 1,
        runner_type: type[CountingRunner] = CountingRunner,
        *,
        onnx: Path | None = None,
        unit: str = UNIT,
        **options: Any,
    ) -> Harness:
        """`onnx` and `unit`: another model than the mlp; `options`: more of the Worker's."""
        cfg = cfg or mlp_config()
        streams, clock = MemoryStreams(), Clock()
        runner = runner_type(cfg, onnx or model)
        worker = Worker(
            tier=tier,
            configs={unit: cfg},
            runners={unit: runner},
            streams=streams,
            handoff=PostprocessClient(channel, timeout_s=5),
            telemetry=telemetry,
            clock_ns=clock.ns,
            sleep=clock.sleep,
            lanes=lanes,
            **options,
        )
        await worker.open()
        return Harness(worker, streams, clock, runner, downstream)

    try:
        yield build
    finally:
        await channel.close()


async def test_the_heartbeat_carries_the_provider_each_session_got(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make(tier="edge")
    assert h.runner.provider == "CPUExecutionProvider"
    assert h.streams.providers == {(UNIT, "edge"): "CPUExecutionProvider"}
    await h.worker.leave()
    assert h.streams.providers == {}


async def test_a_streams_entries_compute_in_one_run_and_are_acked_in_one_done(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make()
    ids = [h.add(f"r{i}", LOW) for i in range(5)]
    h.streams.calls.clear()
    await h.steps()
    assert h.runner.runs == [[f"r{i}" for i in range(5)]]
    assert h.acked() == [(LOW, tuple(ids))]
    # One read, one look at the cancel flags, one ack: per batch, not per request.
    assert [m for m, _, _ in h.streams.calls] == ["read", "cancelled", "done"]
    for i in range(5):
        result = h.result(f"r{i}")
        assert result.code == grpc.StatusCode.OK and result.batch_size == 5
        assert result.outputs[0].shape == (1, 3)
    assert h.worker.computed_rows == 5
    assert not h.streams.entries[LOW] and not h.streams.pending[LOW]


async def test_a_batch_never_exceeds_the_max_batch_size(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make()
    ids = [h.add(f"r{i}", LOW) for i in range(40)]  # the mlp batches at most 32
    await h.steps(2)
    assert [len(run) for run in h.runner.runs] == [32, 8]
    # Two hand-offs in flight at once: either may be acknowledged first.
    assert sorted(h.acked(), key=lambda a: a[1][0]) == [
        (LOW, tuple(ids[:32])),
        (LOW, tuple(ids[32:])),
    ]
    assert {h.result(f"r{i}").batch_size for i in range(40)} == {32, 8}


async def test_the_hand_off_comes_before_the_ack(make: Callable[..., Awaitable[Harness]]) -> None:
    h = await make()
    for i in range(3):
        h.add(f"r{i}", LOW)
    by_entry = {e: r for r, e in h.entry_ids.items()}
    answered_at_ack: list[bool] = []
    h.streams.on_done = lambda stream, ids: answered_at_ack.extend(
        h.answers[by_entry[i]].done() for i in ids
    )
    await h.steps()
    assert answered_at_ack == [True, True, True]


async def test_a_cancelled_request_that_waited_is_skipped_before_compute(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make()
    gone = h.add("gone", LOW)
    kept = h.add("kept", LOW)
    h.clock.now += CANCEL_CHECK_FIRST_NS  # they waited in the stream: flags first
    h.streams.cancel_flags.add("gone")
    await h.steps()
    assert h.runner.runs == [["kept"]]
    assert h.acked() == [(LOW, (gone,)), (LOW, (kept,))]  # at once, then after the hand-off
    assert not h.answers["gone"].done()  # its caller left: nothing handed off
    assert h.result("kept").code == grpc.StatusCode.OK
    assert h.worker.cancelled == 1 and h.worker.computed_rows == 1


async def test_the_flags_of_buffered_requests_come_with_the_next_read(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """More than a batch waited: the next batch's cancel flags are read in the round trip
    of the step's read, not in one of their own; one whose caller left meanwhile is dropped
    then (acknowledged at once), never computed."""
    h = await make()
    ids = [h.add(f"r{i}", LOW) for i in range(40)]  # the mlp batches at most 32
    h.clock.now += CANCEL_CHECK_FIRST_NS  # they waited in the stream: flags first
    await h.steps()
    assert [len(run) for run in h.runner.runs] == [32]
    h.streams.cancel_flags.add("r39")
    h.streams.calls.clear()
    await h.steps()
    assert h.runner.runs[1] == [f"r{i}" for i in range(32, 39)]
    assert [m for m, _, _ in h.streams.calls] == ["flags", "read", "done", "done"]
    assert h.streams.named("flags") == [(None, tuple(f"r{i}" for i in range(32, 40)))]
    assert h.acked() == [(LOW, (ids[39],)), (LOW, tuple(ids[32:39]))]
    assert not h.answers["r39"].done()
    assert h.worker.cancelled == 1 and h.worker.computed_rows == 39


async def test_a_fresh_batch_computes_while_its_cancel_flags_are_read(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """Requests that just arrived: no round trip before compute; one whose caller left
    meanwhile is computed but never handed off, and acknowledged at once."""
    h = await make()
    gone = h.add("gone", LOW)
    kept = h.add("kept", LOW)
    h.streams.cancel_flags.add("gone")
    h.streams.calls.clear()
    await h.steps()
    assert h.runner.runs == [["gone", "kept"]]
    methods = [m for m, _, _ in h.streams.calls]
    assert methods == ["read", "cancelled", "done", "done"]
    assert h.acked() == [(LOW, (gone,)), (LOW, (kept,))]
    assert not h.answers["gone"].done()
    assert h.result("kept").code == grpc.StatusCode.OK
    assert h.worker.cancelled == 1


async def test_an_expired_request_is_dropped_before_compute(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """Dropped as soon as it is read, before the pick: the more urgent stream it sits on
    does not take the turn of the live request on the other."""
    h = await make()
    late = h.add("late", HIGH, deadline_ms=5)
    h.clock.now += 10 * MS  # it waited in the stream past its deadline
    fresh = h.add("fresh", LOW)
    await h.steps()
    assert h.runner.runs == [["fresh"]]
    assert h.acked() == [(HIGH, (late,)), (LOW, (fresh,))]
    assert not h.answers["late"].done()  # its gateway answered DEADLINE_EXCEEDED itself
    assert h.worker.expired == 1 and h.worker.computed_rows == 1


async def test_a_poison_request_is_dead_lettered_and_spares_its_batch(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """The mlp takes 4 values per row: a 5-wide request makes onnxruntime raise."""
    h = await make()
    bad = h.add("bad", LOW, width=5)
    good = h.add("good", LOW)
    await h.steps()
    assert h.runner.runs == [["bad", "good"], ["bad"], ["good"]]  # the batch, then alone
    assert [(e.entry_id, reason) for e, reason in h.streams.dead] == [
        (bad, "model execution failed on this request")
    ]
    assert h.acked() == [(LOW, (good,))]
    assert h.result("good").code == grpc.StatusCode.OK
    assert h.result("bad").code == grpc.StatusCode.ABORTED
    assert h.worker.dead_lettered == 1 and h.worker.computed_rows == 1
    assert not h.streams.entries[LOW]


async def test_the_higher_priority_stream_is_dispatched_first(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make()
    low = h.add("low", LOW)  # queued first, read in the same read
    high = h.add("high", HIGH)
    await h.steps()
    assert h.runner.runs == [["high"]]
    assert h.acked() == [(HIGH, (high,))]
    await h.steps()
    assert h.runner.runs == [["high"], ["low"]]
    assert h.acked()[1] == (LOW, (low,))


async def test_a_batch_waits_for_company_on_the_injected_clock(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """Without the adaptive wait a batch waits its whole max_batch_wait_ms (2 ms for the
    mlp), polling the stream meanwhile: what arrives during the wait joins the batch."""
    h = await make(mlp_config(batching={"adaptive_wait": False}))
    h.add("first", LOW, deadline_ms=None)
    started = h.clock.now

    def arrive() -> None:  # during the first pause of the wait
        if "second" not in h.answers:
            h.add("second", LOW, deadline_ms=None)

    h.clock.on_sleep = arrive
    await h.steps()
    assert h.runner.runs == [["first", "second"]]
    assert h.clock.now - started == 2 * MS  # the wait, on the clock
    assert all(s <= 0.0005 for s in h.clock.slept)


EDGE, CENTER = StreamKey(UNIT, "edge", 2, 0), StreamKey(UNIT, "center", 2, 0)


async def unsure_edge(make: Callable[..., Awaitable[Harness]]) -> Harness:
    """An edge worker of a model whose every edge answer is unsure, a center worker live."""
    cfg = mlp_config(
        tiers={"edge": {"max_cost": 0}, "center": {}},
        cascade={"output": "OUTPUT0", "threshold": 1.0},  # no answer is that sure
    )
    h = await make(cfg, tier="edge")
    h.streams.workers[(UNIT, "center")].add("center-worker")
    return h


async def test_an_unsure_edge_answer_cascades_to_center(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await unsure_edge(make)
    edge, center = EDGE, CENTER
    entry = h.add("unsure", edge)
    await h.steps()
    assert h.runner.runs == [["unsure"]]
    assert h.acked() == [(edge, (entry,))]  # acknowledged here ...
    assert not h.answers["unsure"].done()  # ... and answered by center
    (moved,) = h.streams.entries[center].values()
    job = decode_job(moved[keys.JOB_FIELD.encode()])
    assert job.tier == "center" and job.annotations["cascaded"] == "true"
    assert h.worker.cascaded == 1


async def test_a_caller_who_says_cascade_false_gets_the_unsure_edge_answer(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await unsure_edge(make)
    edge, center = EDGE, CENTER
    # As both doors read it from the request's parameters.
    entry = h.add("hurried", edge, controls=Controls.from_parameters({"cascade": False}))
    await h.steps()
    assert h.acked() == [(edge, (entry,))]
    result = await asyncio.wait_for(h.answers["hurried"], 5)
    assert result.code == grpc.StatusCode.OK and result.tier == "edge"
    assert "cascaded" not in result.annotations and not h.streams.entries[center]
    assert h.worker.cascaded == 0


async def test_a_dead_workers_entries_are_reclaimed_and_served(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make()
    entry = h.add("orphan", LOW)
    assert len(await h.streams.read([LOW], 10, None)) == 1  # as another consumer ...
    h.streams.pending[LOW][entry] = "dead-worker"  # ... that died with it
    await h.worker.reclaim()
    await h.steps()
    assert h.runner.runs == [["orphan"]]
    assert h.acked() == [(LOW, (entry,))]
    assert h.result("orphan").code == grpc.StatusCode.OK and h.worker.reclaimed == 1


class HeldRunner(CountingRunner):
    """Each run waits (in its thread) until the test lets it go; `started` counts runs that
    began, so a test sees two batches inside onnxruntime at once."""

    def __init__(self, cfg: ModelConfig, path: Path) -> None:
        super().__init__(cfg, path)
        self.go = threading.Event()
        self.started = threading.Semaphore(0)

    def run(self, jobs: Sequence[Job], alone: bool = False) -> list[JobOutputs]:
        self.runs.append([j.request_id for j in jobs])
        self.threads.append(threading.get_ident())
        self.alone.append(alone)
        self.started.release()
        if not self.go.wait(timeout=30):
            raise TimeoutError("the test never let the run go")
        return ModelRunner.run(self, jobs, alone)


async def started_runs(runner: HeldRunner, n: int) -> None:
    """Wait (polling, with a deadline) until `n` runs are inside the runner at once."""
    for _ in range(n):
        assert await asyncio.to_thread(runner.started.acquire, True, 30), "run never started"


async def test_with_two_lanes_the_next_batch_computes_while_the_first_does(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """The first step returns while its batch is in onnxruntime; the second reads what
    arrived meanwhile and starts it on the other lane; both are handed off and acked."""
    h = await make(lanes=2, runner_type=HeldRunner)
    runner = h.runner
    assert isinstance(runner, HeldRunner)
    first = [h.add(f"a{i}", LOW) for i in range(3)]
    await h.worker.step()
    await started_runs(runner, 1)
    second = [h.add(f"b{i}", LOW) for i in range(2)]
    await h.worker.step()
    await started_runs(runner, 1)  # both runs are inside the session now
    assert runner.runs == [["a0", "a1", "a2"], ["b0", "b1"]]
    assert not h.acked()  # nothing is handed off before it is computed
    runner.go.set()
    await h.worker.drain()
    assert sorted(h.acked()) == sorted([(LOW, tuple(first)), (LOW, tuple(second))])
    assert {h.result(r).batch_size for r in ("a0", "a1", "a2")} == {3}
    assert {h.result(r).batch_size for r in ("b0", "b1")} == {2}
    assert h.worker.computed_rows == 5


async def test_with_every_lane_busy_a_step_waits_for_one(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make(lanes=2, runner_type=HeldRunner)
    runner = h.runner
    assert isinstance(runner, HeldRunner)
    for batch in range(2):
        h.add(f"r{batch}", LOW)
        await h.worker.step()
        await started_runs(runner, 1)
    entry = h.add("third", LOW)
    third = asyncio.create_task(h.worker.step())
    for _ in range(10):  # turns of the event loop, not time: the step has run up to a wait
        await asyncio.sleep(0)
    assert not third.done() and len(runner.runs) == 2
    assert h.streams.pending[LOW].get(entry) is None  # no lane free: not even read
    runner.go.set()
    await third
    await h.worker.drain()
    assert runner.runs == [["r0"], ["r1"], ["third"]]
    assert h.result("third").code == grpc.StatusCode.OK


async def test_a_lane_that_fails_fails_the_loop(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """A failure the executor does not catch (a model's own errors it isolates per request,
    so the executor itself is made to fail) surfaces from `drain` and at the next step, as
    it would have inline."""
    h = await make(lanes=2)

    async def broken(*args: Any) -> Any:
        raise RuntimeError("executor bug")

    h.worker._executor.run = broken  # type: ignore[method-assign]
    h.add("r", LOW)
    await h.worker.step()
    with pytest.raises(RuntimeError, match="executor bug"):
        await h.worker.drain()
    h.add("next", LOW)
    with pytest.raises(RuntimeError, match="executor bug"):
        await h.worker.step()


async def test_a_lane_that_fails_ends_run_with_its_error(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make(lanes=2)

    async def broken(*args: Any) -> Any:
        raise RuntimeError("executor bug")

    h.worker._executor.run = broken  # type: ignore[method-assign]
    h.add("r", LOW)
    with pytest.raises(RuntimeError, match="executor bug"):
        await asyncio.wait_for(h.worker.run(), 30)


async def _short_batches(
    make: Callable[..., Awaitable[Harness]],
) -> tuple[Harness, CountingRunner]:
    """A two-lane worker whose batches take a quarter of the inline bound, after its first
    batch (computed in a thread: no estimate before it)."""
    h = await make(lanes=2)
    runner = h.runner
    assert isinstance(runner, CountingRunner)
    runner.clock, runner.run_ns = h.clock, INLINE_MAX_NS // 4
    h.add("first", LOW)
    await h.steps()
    return h, runner


async def test_a_short_batch_on_an_idle_worker_computes_on_the_loops_thread(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """The first batch of a stream has no compute estimate yet: a thread. Once one is known
    and short, and nothing else computes or is being handed off, the loop's own thread, with
    no cancel read (a caller that left meanwhile gets its answer dropped by its gateway);
    a batch expected to take long, a thread again."""
    h, runner = await _short_batches(make)
    loop_thread = threading.get_ident()
    estimate = h.worker._scheduler.compute_estimate_ns(LOW, 1)
    second = h.add("second", LOW)
    h.streams.cancel_flags.add("second")
    h.streams.calls.clear()
    runner.run_ns = INLINE_MAX_NS // 8  # faster inline: the estimate stays the lane's
    await h.steps()
    assert runner.threads[0] != loop_thread and runner.threads[1] == loop_thread
    assert h.worker._scheduler.compute_estimate_ns(LOW, 1) == estimate
    assert [m for m, _, _ in h.streams.calls] == ["read", "done"]
    assert h.acked() == [(LOW, (second,))]
    assert h.result("second").code == grpc.StatusCode.OK
    for i in range(8):  # 8 rows: the estimate (8 x one row's) is too long for the loop
        h.add(f"long{i}", LOW)
    await h.steps()
    assert runner.runs[2] == [f"long{i}" for i in range(8)]
    assert runner.threads[2] != loop_thread
    assert h.worker.inline_batches == 1
    # Only the batch on the loop's thread computes alone: it may take the wide session.
    assert runner.alone == [False, True, False]


async def test_a_batch_whose_ack_is_on_its_way_leaves_the_loop_free_to_compute(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """A lone caller's next request often comes while the previous batch's ack is still
    on its way: that batch is on the wire, so the next short batch computes on the loop's
    thread all the same."""
    h, runner = await _short_batches(make)
    loop_thread = threading.get_ident()
    acked = h.streams.done
    held = asyncio.Event()

    async def held_ack(
        stream: StreamKey, entry_ids: Sequence[str], rate: float | None = None
    ) -> None:
        await held.wait()
        await acked(stream, entry_ids, rate)

    h.streams.done = held_ack  # type: ignore[method-assign]
    h.add("second", LOW)
    await h.worker.step()
    await asyncio.wait_for(asyncio.shield(h.answers["second"]), 10)  # handed off, not acked
    outbox = h.worker._outbox
    assert outbox.in_flight == 1 and outbox.unsent == 0
    h.add("third", LOW)
    await h.worker.step()
    assert runner.runs[1:] == [["second"], ["third"]]
    assert runner.threads[1] == loop_thread and runner.threads[2] == loop_thread
    held.set()
    await h.worker.drain()
    assert [ids for _, ids in h.acked()][-2:] == [(h.entry_ids["second"],), (h.entry_ids["third"],)]
    assert h.worker.inline_batches == 2


async def test_while_a_higher_level_has_traffic_a_cut_stream_buffers_two_cut_batches(
    make: Callable[..., Awaitable[Harness]],
) -> None:
    """A lower level's batches are cut to what computes within the yield (here 1 row: its
    measured cost is 8 ms a row); its buffer then takes two cut batches, read apart from the
    streams read in full (one XREADGROUP counts the same for all its streams), and the rest
    stays in Redis, where other workers can take it."""
    h = await make()
    scheduler = h.worker._scheduler
    scheduler.observe(LOW, 1, 8 * MS)
    scheduler.observe(LOW, 4, 32 * MS)
    h.add("high", HIGH)
    await h.steps()
    assert h.runner.runs == [["high"]]
    low = [h.add(f"low{i}", LOW) for i in range(10)]
    h.streams.calls.clear()
    await h.steps()
    read = [i for _, ids in h.streams.named("read") for i in ids]
    assert read == low[:2]
    assert h.runner.runs[1:] == [["low0"]]
    # Once the higher level is quiet for HIGHER_PRESENT_NS the batches are whole again.
    h.clock.now += HIGHER_PRESENT_NS + 1
    await h.steps()
    assert h.runner.runs[2:] == [[f"low{i}" for i in range(1, 10)]]
