"""The asyncio side of generation on the tiny converted decoder: tokens arrive while the
request still runs, concurrent streams interleave, cancel frees the engine, timings."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import onnxruntime as ort
import pytest

from tests.unit.test_generate_engine import PROMPTS
from tiermesh.convert.llama_check import greedy
from tiermesh.generate.engine import Engine
from tiermesh.generate.scheduler import GenRequest, Limits
from tiermesh.generate.service import GenerationService, timings


def test_timings_from_token_instants() -> None:
    t = timings(7, 1_000_000, [5_000_000, 7_000_000, 11_000_000], "stop")
    assert (t.ttft_ms, t.tpot_ms, t.generated_tokens, t.prompt_tokens) == (4.0, 3.0, 3, 7)
    assert timings(7, 0, [2_000_000], "length").tpot_ms == 0.0
    assert timings(7, 0, [], "rejected:too_large").ttft_ms == 0.0


async def test_streams_yield_tokens_incrementally_and_equal_greedy(
    tiny_decoder: ort.InferenceSession,
) -> None:
    ticks = itertools.count(0, 1_000_000)  # every clock read is 1 ms later
    engine = Engine(tiny_decoder, stop_ids=(), limits=Limits(max_sequences=4, step_tokens=16))
    service = GenerationService(engine, clock_ns=lambda: next(ticks))
    runner = asyncio.create_task(service.run())
    try:
        long = service.submit(GenRequest("long", PROMPTS["p12"], max_new_tokens=30))
        short = service.submit(GenRequest("short", PROMPTS["p3"], max_new_tokens=5))
        seen_running: list[bool] = []

        async def read(stream, into: list[int]) -> None:  # type: ignore[no-untyped-def]
            async for token in stream:
                into.append(token)
                seen_running.append(stream.timings is None)

        got_long: list[int] = []
        got_short: list[int] = []
        await asyncio.wait_for(asyncio.gather(read(long, got_long), read(short, got_short)), 60)
    finally:
        service.stop()
        await asyncio.wait_for(runner, 10)
    assert all(seen_running)  # every token came before its stream ended
    for prompt, new, got in ((PROMPTS["p12"], 30, got_long), (PROMPTS["p3"], 5, got_short)):
        alone, _ = greedy(tiny_decoder, np.array([prompt], np.int64), new, stop=())
        assert got == alone
    assert short.timings is not None and long.timings is not None
    assert (short.timings.end, short.timings.generated_tokens) == ("length", 5)
    assert (long.timings.end, long.timings.generated_tokens) == ("length", 30)
    assert short.timings.ttft_ms > 0 and long.timings.tpot_ms > 0


async def test_cancel_ends_the_stream_and_frees_the_engine(
    tiny_decoder: ort.InferenceSession,
) -> None:
    engine = Engine(tiny_decoder, stop_ids=(), limits=Limits(max_sequences=1, step_tokens=8))
    service = GenerationService(engine)
    runner = asyncio.create_task(service.run())
    try:
        first = service.submit(GenRequest("first", PROMPTS["p7"], max_new_tokens=200))
        waiting = service.submit(GenRequest("next", PROMPTS["p3"], max_new_tokens=3))
        got = []
        async for token in first:
            got.append(token)
            if len(got) == 2:
                first.cancel()
        assert first.timings is not None and first.timings.end == "cancelled"
        assert first.timings.generated_tokens == 2
        # The one slot is free again: the waiting request runs to its end.
        rest = [t async for t in waiting]
        assert len(rest) == 3 and waiting.timings is not None
        assert engine.reserved_tokens == 0 and engine.idle()
        with pytest.raises(ValueError, match="already running"):
            service.submit(GenRequest("next2", PROMPTS["p3"], max_new_tokens=3))
            service.submit(GenRequest("next2", PROMPTS["p3"], max_new_tokens=3))
    finally:
        service.stop()
        await asyncio.wait_for(runner, 10)


async def test_a_cancel_from_elsewhere_wakes_a_waiting_reader(
    tiny_decoder: ort.InferenceSession,
) -> None:
    """The caller leaves while its reader waits for the next token (a worker's cancel watch
    runs in another task): the reader's loop ends instead of waiting for ever."""
    engine = Engine(tiny_decoder, stop_ids=(), limits=Limits(max_sequences=1, step_tokens=8))
    service = GenerationService(engine)
    runner = asyncio.create_task(service.run())
    try:
        stream = service.submit(GenRequest("a", PROMPTS["p7"], max_new_tokens=200))
        first = asyncio.Event()

        async def read() -> int:
            n = 0
            async for _ in stream:
                n += 1
                first.set()
            return n

        reader = asyncio.create_task(read())
        await first.wait()
        stream.cancel()
        assert await asyncio.wait_for(reader, 10) >= 1
        assert stream.timings is not None and stream.timings.end == "cancelled"
    finally:
        service.stop()
        await asyncio.wait_for(runner, 10)


async def test_a_failing_step_ends_its_requests_with_an_error(
    tiny_decoder: ort.InferenceSession,
) -> None:
    """onnxruntime refuses a token id outside the vocabulary (only a client bypassing the
    router could send one): the requests of that step end with "error", the next ones run."""
    engine = Engine(tiny_decoder, stop_ids=(), limits=Limits(max_sequences=4, step_tokens=16))
    service = GenerationService(engine)
    runner = asyncio.create_task(service.run())
    try:
        bad = service.submit(GenRequest("bad", (5, 10**6), max_new_tokens=3))
        assert [t async for t in bad] == []
        assert bad.timings is not None and bad.timings.end == "error"
        good = service.submit(GenRequest("good", PROMPTS["p3"], max_new_tokens=3))
        assert len([t async for t in good]) == 3
        assert engine.idle() and engine.reserved_tokens == 0
    finally:
        service.stop()
        await asyncio.wait_for(runner, 10)
