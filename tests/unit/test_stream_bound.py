"""ModelStreamInfer holds at most MAX_IN_FLIGHT answers of a client that does not read them,
and about MAX_HELD_BYTES of its requests and answers: a request's slot and bytes are freed
when its answer is written, not when it is ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from tritonclient.grpc import service_pb2

from tiermesh.core.jobs import JobResult
from tiermesh.gateway.dispatch import Answer
from tiermesh.gateway.plane import Caller
from tiermesh.gateway.stream import MAX_HELD_BYTES, MAX_IN_FLIGHT, stream_infer

CALLER = Caller((), None, "ipv4:127.0.0.1:1")


class AnsweringPlane:
    """Answers every request at once (the one fake: the data plane has its own tests)."""

    def __init__(self, progress: asyncio.Event) -> None:
        self.answered = 0
        self._progress = progress

    async def infer(self, model: str, parse: Callable[..., Any], caller: Caller, piece: Any) -> Any:
        self.answered += 1
        self._progress.set()
        return Answer(JobResult(request_id=str(self.answered), model=model, gateway=""), 0)

    def is_generative(self, model: str) -> bool:
        return False


async def _until(check: Callable[[], bool], progress: asyncio.Event) -> None:
    """Wait, within a deadline, until `check` holds; `progress` is set at each change."""
    async with asyncio.timeout(10):
        while not check():
            progress.clear()
            await progress.wait()


async def test_a_client_that_does_not_read_holds_at_most_max_in_flight_answers() -> None:
    progress = asyncio.Event()
    plane = AnsweringPlane(progress)
    taken = 0

    async def requests() -> AsyncIterator[Any]:
        nonlocal taken
        for i in range(MAX_IN_FLIGHT * 4):
            taken += 1
            progress.set()
            yield service_pb2.ModelInferRequest(model_name="m", id=str(i))

    answers = stream_infer(plane, requests(), lambda: CALLER)  # type: ignore[arg-type]
    first = await answers.__anext__()  # then the client reads no more
    assert first.infer_response.model_name == "m"
    # Every slot's request answered, and one more request taken, waiting for a slot.
    await _until(lambda: plane.answered == MAX_IN_FLIGHT and taken == MAX_IN_FLIGHT + 1, progress)
    for _ in range(100):  # the loop has every chance to take more: it takes none
        await asyncio.sleep(0)
    assert (plane.answered, taken) == (MAX_IN_FLIGHT, MAX_IN_FLIGHT + 1)
    # Reading one answer frees one slot: one more request is taken and answered.
    await answers.__anext__()
    await _until(lambda: plane.answered == MAX_IN_FLIGHT + 1, progress)
    await answers.aclose()


async def test_big_requests_are_held_by_their_bytes_and_one_past_the_bound_goes_alone() -> None:
    progress = asyncio.Event()
    plane = AnsweringPlane(progress)
    taken = 0
    big = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[bytes(1 << 20)])
    alone = service_pb2.ModelInferRequest(raw_input_contents=[bytes(MAX_HELD_BYTES + 1)])

    async def requests() -> AsyncIterator[Any]:
        nonlocal taken
        for request in [big] * 20 + [alone]:
            taken += 1
            progress.set()
            yield request

    answers = stream_infer(plane, requests(), lambda: CALLER)  # type: ignore[arg-type]
    await answers.__anext__()  # then the client reads no more
    fit = MAX_HELD_BYTES // big.ByteSize()  # 3: far fewer than MAX_IN_FLIGHT
    await _until(lambda: plane.answered == fit and taken == fit + 1, progress)
    for _ in range(100):
        await asyncio.sleep(0)
    assert plane.answered == fit
    # Reading frees the bytes of what was written: the rest follow, the last one alone.
    for _ in range(20):
        await answers.__anext__()
    await _until(lambda: plane.answered == 21, progress)
    await answers.aclose()


def test_held_sizes_are_those_of_the_messages_without_serialising_them() -> None:
    from tiermesh.gateway.stream import _answer_bytes, _request_bytes

    raw = service_pb2.ModelInferRequest(model_name="m", raw_input_contents=[bytes(1 << 20)])
    raw.inputs.add(name="X", datatype="FP32", shape=[1, 1 << 18])
    typed = service_pb2.ModelInferRequest(model_name="m")
    # Typed contents count 8 bytes an element: fp64's size on the wire, any type's parsed.
    typed.inputs.add(name="X", datatype="FP64", shape=[1, 1000]).contents.fp64_contents.extend(
        [0.5] * 1000
    )
    texts = service_pb2.ModelInferRequest(model_name="m")
    texts.inputs.add(name="T", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"x" * 5000, b"y" * 3000]
    )
    for request in (raw, typed, texts):
        assert abs(_request_bytes(request) - request.ByteSize()) <= 256, request
    answer = service_pb2.ModelStreamInferResponse(
        infer_response=service_pb2.ModelInferResponse(raw_output_contents=[bytes(1 << 20)])
    )
    assert abs(_answer_bytes(answer) - answer.ByteSize()) <= 256
