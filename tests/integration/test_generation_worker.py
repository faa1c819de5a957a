"""A worker's generative loop (worker/generation.py) on a tiny converted decoder, against real
Redis, a real postprocess and a real Delivery server: pieces then the answer, acknowledgement
after the hand-off, callers that leave, expired requests, a graceful stop, and a running
entry that no other worker's reclaim takes over."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import redis.asyncio as aioredis
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.integration.conftest import Downstream
from tests.polling import until
from tiermesh.convert.llama_check import greedy
from tiermesh.core import keys
from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import GenerationRequest, Job, JobResult, Timing
from tiermesh.core.keys import StreamKey
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.server import make_channel
from tiermesh.core.telemetry import Telemetry
from tiermesh.core.tensors import from_numpy
from tiermesh.core.wire import encode_job
from tiermesh.generate.detok import TextStream
from tiermesh.generate.engine import Engine
from tiermesh.generate.scheduler import Limits
from tiermesh.generate.service import GenerationService
from tiermesh.generate.tensors import output_text
from tiermesh.worker.generation import GenerationTimers, GenerationWorker
from tiermesh.worker.handoff import PostprocessClient
from tiermesh.worker.streams import StreamClient

pytestmark = pytest.mark.integration
UNIT = ComputeUnit("tiny", "1", "fp32")
STREAM = StreamKey(UNIT, "center", 1, 0)
LOW = StreamKey(UNIT, "center", 2, 0)
PROMPT = (5, 17, 42, 9)
# An answer far longer than any wait in these tests (the tiny decoder's tokens take ~1 ms).
LONG = 2000
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
CONFIG = {
    "name": "tiny",
    "max_batch_size": 0,
    "inputs": [{"name": "text_input", "datatype": "BYTES", "dims": [1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "dims": [1]}],
    "generation": {"context_length": 2048, "max_new_tokens": 2000, "max_kv_tokens": 4096},
    "versions": {"1": {"model.onnx": "0" * 64}},
}


def decode(ids: Sequence[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def text(stop: Sequence[str]) -> TextStream:
    return TextStream(decode, stop)


@dataclass
class Rig:
    worker: GenerationWorker
    service: GenerationService
    task: asyncio.Task[None]
    redis: aioredis.Redis
    down: Downstream
    spans: InMemorySpanExporter | None = None

    async def send(
        self, rid: str, new: int, stream: bool = True, deadline_ns: int = 0, priority: int = 1
    ) -> None:
        ids = from_numpy("input_ids", np.asarray([PROMPT], np.int64), "INT64")
        job = Job(
            rid,
            "tiny",
            (ids,),
            self.down.delivery_address,
            deadline_ns=deadline_ns,
            version="1",
            variant="fp32",
            priority=priority,
            tier="center",
            timing=Timing(enqueued_ns=1),
            trace_context={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"},
            generation=GenerationRequest(new, stream=stream),
        )
        stream_key = StreamKey(UNIT, "center", priority, 0)
        await self.redis.xadd(stream_key.name, {keys.JOB_FIELD: encode_job(job)})

    async def backlog(self) -> int:
        """Entries in the streams (delivered or not): 0 once everything is acknowledged."""
        return sum([int(await self.redis.xlen(k.name)) for k in (STREAM, LOW)])


@pytest.fixture
async def rig(
    redis_url: str,
    tiny_decoder: ort.InferenceSession,
    downstream: Downstream,
) -> AsyncIterator[Rig]:
    redis = aioredis.Redis.from_url(redis_url)
    telemetry = Telemetry("test")
    spans = InMemorySpanExporter()
    telemetry.provider.add_span_processor(SimpleSpanProcessor(spans))
    channel = make_channel(downstream.postprocess_address)
    worker, service = make_worker(redis, tiny_decoder, channel, "w1", tracer=telemetry.tracer)
    task = asyncio.create_task(worker.run())
    await worker.started.wait()
    try:
        yield Rig(worker, service, task, redis, downstream, spans)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
        await channel.close()
        await redis.aclose()


def make_worker(
    redis: aioredis.Redis,
    session: ort.InferenceSession,
    channel: Any,
    consumer: str,
    tracer: trace.Tracer | None = None,
    **timers: int,
) -> tuple[GenerationWorker, GenerationService]:
    cfg: ModelConfig = parse_config(CONFIG, "tiny")
    limits = Limits(max_sequences=2, max_kv_tokens=4096, step_tokens=8)
    service = GenerationService(Engine(session, (), limits))
    worker = GenerationWorker(
        unit=UNIT,
        cfg=cfg,
        tier="center",
        service=service,
        text=text,
        streams=StreamClient(redis, consumer),
        handoff=PostprocessClient(channel),
        timers=GenerationTimers(poll_block_ms=20, cancel_poll_ms=20, **timers),
        tracer=tracer,
    )
    return worker, service


async def test_pieces_then_the_answer_then_the_ack(rig: Rig, tiny_decoder: Any) -> None:
    pieces: list[JobResult] = []
    answer = rig.down.pending.register("a", pieces.append)
    await rig.send("a", 6)
    result = await asyncio.wait_for(answer, 10)
    expected, _ = greedy(tiny_decoder, np.array([PROMPT], np.int64), 6, stop=())
    assert output_text(result.outputs) == decode(expected)
    assert "".join(output_text(p.outputs) for p in pieces) == decode(expected)
    offsets = [p.text_offset for p in pieces]
    assert offsets == sorted(offsets) and offsets[0] == 0
    assert result.annotations["generated_tokens"] == "6"
    assert result.annotations["finish_reason"] == "length"
    await until(lambda: _zero(rig.backlog()), "the entry to be acknowledged")
    assert rig.spans is not None
    (span,) = [s for s in rig.spans.get_finished_spans() if s.name.endswith(" generate")]
    assert span.kind == SpanKind.CONSUMER and span.parent is not None
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == PARENT_ID
    assert span.attributes is not None
    assert span.attributes["tiermesh.generated_tokens"] == "6"


async def test_a_whole_answer_has_no_pieces(rig: Rig) -> None:
    pieces: list[JobResult] = []
    answer = rig.down.pending.register("b", pieces.append)
    await rig.send("b", 4, stream=False)
    assert len(output_text((await asyncio.wait_for(answer, 10)).outputs)) > 0
    assert pieces == []


async def test_a_caller_who_left_frees_the_slot(rig: Rig) -> None:
    started = asyncio.Event()
    answer = rig.down.pending.register("c", lambda _: started.set())
    await rig.send("c", LONG)
    await asyncio.wait_for(started.wait(), 10)
    await rig.redis.set(keys.cancel_key("c"), 1)
    await until(lambda: _true(rig.service.running == 0), "the sequence to stop")
    await until(lambda: _zero(rig.backlog()), "the entry to be acknowledged")
    assert rig.worker.cancelled == 1 and not answer.done()


async def test_an_expired_request_is_acknowledged_unrun(rig: Rig) -> None:
    await rig.send("d", 5, deadline_ns=1)
    await until(lambda: _zero(rig.backlog()), "the entry to be acknowledged")
    assert rig.worker.generated == 0


async def test_a_high_priority_request_takes_the_next_slot(rig: Rig) -> None:
    """Both slots run long answers; a low-priority request comes, then a high-priority one.
    They wait (nothing running is preempted); when a slot frees (a caller leaves), the
    high-priority one takes it."""
    order: list[str] = []
    started = asyncio.Event()
    names = ("long1", "long2", "low", "high")
    answers = [rig.down.pending.register(rid, lambda _: started.set()) for rid in names[:2]]
    answers += [rig.down.pending.register(rid) for rid in names[2:]]
    for answer, rid in zip(answers[2:], names[2:], strict=True):
        answer.add_done_callback(lambda _, rid=rid: order.append(rid))
    await rig.send("long1", LONG)
    await rig.send("long2", LONG)
    await asyncio.wait_for(started.wait(), 10)
    await rig.send("low", 5, priority=2)
    await rig.send("high", 5, priority=1)
    await until(lambda: _true(len(rig.worker._running) == 4), "both to be read")
    assert rig.service.running == 2  # the two long ones keep their slots
    await rig.redis.set(keys.cancel_key("long1"), 1)
    await asyncio.wait_for(asyncio.gather(*answers[2:]), 30)
    assert order == ["high", "low"]  # long2 still runs
    await rig.redis.set(keys.cancel_key("long2"), 1)


async def test_stop_finishes_what_runs_and_hands_it_off(rig: Rig) -> None:
    started = asyncio.Event()
    answer = rig.down.pending.register("e", lambda _: started.set())
    await rig.send("e", 40)
    await asyncio.wait_for(started.wait(), 10)
    rig.worker.stop()
    await asyncio.wait_for(rig.task, 10)
    assert (await answer).annotations["generated_tokens"] == "40"
    assert await rig.backlog() == 0


async def test_a_running_entry_is_not_taken_over(
    redis_url: str,
    tiny_decoder: ort.InferenceSession,
    downstream: Downstream,
) -> None:
    """Worker 2 reclaims entries idle for 150 ms; worker 1's answer runs far longer, touching
    its entry meanwhile, so worker 2 never takes it."""
    redis = aioredis.Redis.from_url(redis_url)
    channel = make_channel(downstream.postprocess_address)
    timers = {"reclaim_min_idle_ms": 150, "reclaim_interval_ms": 30}
    one, one_service = make_worker(redis, tiny_decoder, channel, "w1", **timers)
    two, _ = make_worker(redis, tiny_decoder, channel, "w2", **timers)
    first = asyncio.create_task(one.run())
    await one.started.wait()
    rig = Rig(one, one_service, first, redis, downstream)
    answer = downstream.pending.register("f", lambda _: None)
    await rig.send("f", 1000)  # ~1 s: the entry goes idle for far longer than 150 ms
    await until(lambda: _true(bool(one._running)), "worker 1 to take the request")
    second = asyncio.create_task(two.run())
    try:
        result = await asyncio.wait_for(answer, 30)
        assert result.worker == "w1" and result.annotations["generated_tokens"] == "1000"
        assert two.generated == 0 and not two._running
    finally:
        one.stop()
        two.stop()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        await channel.close()
        await redis.aclose()


async def _zero(value: Any) -> bool:
    return await value == 0


async def _true(value: bool) -> bool:
    return value
