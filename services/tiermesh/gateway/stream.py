"""ModelStreamInfer: each request on the bidirectional stream is one ModelInfer through the
data plane's one inference path (plane.py), answered with one response carrying the
request's id, as soon as it is ready (so not necessarily in the order sent: a client
matches answers by id, as with Triton). A request that fails gets its error in
`error_message` and does not end the stream.

A request to a generative model is answered with several responses (a decoupled model, in
Triton's words): one per piece of text as the worker produces it, then a last one with the
rest of the text and the answer's facts, marked `triton_final_response` (the pieces are
marked false). A client that leaves the stream cancels its requests: the workers stop
generating them.

Requests are taken off the stream while fewer than MAX_IN_FLIGHT of its requests, and fewer
than MAX_HELD_BYTES of them and their answers, are unanswered or answered but not yet written
to the client; beyond that the stream's flow control holds the client back, and one that
never reads its answers holds no more (a request bigger than the byte bound goes alone).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from tritonclient.grpc import service_pb2

from tiermesh.core.errors import INTERNAL_MESSAGE, MeshError
from tiermesh.core.grpc_errors import REDIS_OUTAGE, REDIS_OUTAGE_MESSAGE
from tiermesh.core.jobs import JobResult
from tiermesh.gateway import converters
from tiermesh.gateway.decoding import Refused
from tiermesh.gateway.generation import TextCursor
from tiermesh.generate.tensors import output_text, text_tensor

if TYPE_CHECKING:
    from tiermesh.gateway.plane import Caller, DataPlane

log = structlog.get_logger("tiermesh.gateway.stream")

MAX_IN_FLIGHT = 64
# Each request held costs the gateway a few times its size (message, job, answer, gRPC's
# buffers) and the worker more: 64 echoes of 1 MiB grew the gateway 278 MiB when only their
# count was bounded; with 8 MiB, gateway and worker +55-65 MiB each; with 4 MiB, see
# tests/e2e/test_hostile_costs_e2e.py. A stream of big requests still has 2-4 at once.
MAX_HELD_BYTES = 4 << 20
_END = object()


class HeldBytes:
    """Bytes of one stream's requests and answers not yet written: `take` waits for room
    (alone past the bound: a request bigger than it is still served), `add` counts an answer
    at once (it exists), `free` gives back what was written."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._held = 0
        self._freed = asyncio.Event()

    async def take(self, n: int) -> None:
        """By the stream's one reader."""
        while self._held and self._held + n > self._limit:
            self._freed.clear()
            await self._freed.wait()
        self._held += n

    def add(self, n: int) -> None:
        self._held += n

    def free(self, n: int) -> None:
        self._held -= n
        self._freed.set()


# What a tensor's name, shape and parameters count for in a message's size, about.
_FRAMING = 64


def _request_bytes(request: Any) -> int:
    """About a request's size, without serialising it as ByteSize does (1.6 ms for 1 MiB):
    its raw contents, typed contents at 8 bytes an element, its BYTES elements."""
    size = sum(len(raw) for raw in request.raw_input_contents)
    for tensor in request.inputs:
        contents = tensor.contents
        size += 8 * sum(len(getattr(contents, name)) for name in converters.TYPED_FIELDS)
        size += sum(len(element) for element in contents.bytes_contents) + _FRAMING
    return size + _FRAMING


def _answer_bytes(response: Any) -> int:
    """About a stream response's size (answers carry raw outputs), likewise."""
    answer = response.infer_response
    raw = sum(len(r) for r in answer.raw_output_contents)
    return raw + _FRAMING * (len(answer.outputs) + 1) + len(response.error_message)


@dataclass(frozen=True, slots=True)
class _Last:
    """A request's last response: its slot and bytes are freed when the stream has written
    it, so a client that does not read holds at most MAX_IN_FLIGHT answers and about
    MAX_HELD_BYTES here, not every one."""

    response: Any
    held: int  # the request's bytes and the answer's


def _error(request: Any, message: str) -> service_pb2.ModelStreamInferResponse:
    """The stream's answer to a failed request (None: one that did not parse)."""
    if request is None:
        return service_pb2.ModelStreamInferResponse(error_message=message)
    return service_pb2.ModelStreamInferResponse(
        error_message=message,
        infer_response=service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


async def _answer(plane: DataPlane, request: Any, caller: Caller, out: asyncio.Queue[Any]) -> Any:
    """The (last) stream response for one request; pieces of a generative answer go to
    `out` before it. Never raises but for cancellation."""
    cursor = TextCursor()

    def piece(result: JobResult) -> None:
        text = cursor.piece(result.text_offset, output_text(result.outputs))
        if text:
            response = converters.piece_response(result, text_tensor(text))
            out.put_nowait(service_pb2.ModelStreamInferResponse(infer_response=response))

    try:
        answer = await plane.infer(
            request.model_name,
            lambda screen: converters.infer_request(request, screen),
            caller,
            piece,
        )
    except MeshError as err:
        return _error(request, err.message)
    except asyncio.CancelledError:
        raise
    except REDIS_OUTAGE:
        return _error(request, REDIS_OUTAGE_MESSAGE)
    except Exception:
        log.exception("unexpected error on a stream request")
        return _error(request, INTERNAL_MESSAGE)
    result = answer.result
    generative = plane.is_generative(result.model)
    if generative:
        result = result.with_(outputs=(text_tensor(cursor.rest(output_text(result.outputs))),))
    response = converters.infer_response(result, answer.responded_ns, answer.cache_hit)
    if generative:
        response.parameters[converters.FINAL_RESPONSE].bool_param = True
    return service_pb2.ModelStreamInferResponse(infer_response=response)


async def stream_infer(
    plane: DataPlane,
    requests: AsyncIterator[Any],
    caller: Callable[[], Caller],
) -> AsyncIterator[Any]:
    """The responses of one stream. `caller` is asked at each request (its deadline is
    the stream's time left then)."""
    out: asyncio.Queue[Any] = asyncio.Queue()
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    held = HeldBytes(MAX_HELD_BYTES)
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: Any, size: int) -> None:
        answered = False
        try:
            response = await _answer(plane, request, caller(), out)
            answer_size = _answer_bytes(response)
            held.add(answer_size)
            out.put_nowait(_Last(response, size + answer_size))
            answered = True  # its slot and bytes are freed once the answer is written, below
        finally:
            if not answered:
                slots.release()
                held.free(size)

    async def read() -> None:
        try:
            async for request in requests:
                if isinstance(request, Refused):  # did not inflate or parse (decoding.py)
                    out.put_nowait(_error(None, request.message))
                    continue
                await slots.acquire()
                size = _request_bytes(request)
                await held.take(size)
                task = asyncio.create_task(one(request, size))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            out.put_nowait(_END)

    reader = asyncio.create_task(read(), name="stream-reader")
    try:
        while (message := await out.get()) is not _END:
            if isinstance(message, _Last):
                yield message.response
                slots.release()
                held.free(message.held)
            else:
                yield message
    finally:
        # The client went away or the stream ended: nothing of it keeps running.
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
