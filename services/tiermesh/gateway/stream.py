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

Requests are taken off the stream while fewer than MAX_IN_FLIGHT of its requests are
unanswered or answered but not yet written to the client; beyond that the stream's flow
control holds the client back, and one that never reads its answers holds no more.
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
_END = object()


@dataclass(frozen=True, slots=True)
class _Last:
    """A request's last response: its slot is freed when the stream has written it, so a
    client that does not read holds at most MAX_IN_FLIGHT answers here, not every one."""

    response: Any


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
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: Any) -> None:
        answered = False
        try:
            out.put_nowait(_Last(await _answer(plane, request, caller(), out)))
            answered = True  # its slot is freed once the answer is written, below
        finally:
            if not answered:
                slots.release()

    async def read() -> None:
        try:
            async for request in requests:
                if isinstance(request, Refused):  # did not inflate or parse (decoding.py)
                    out.put_nowait(_error(None, request.message))
                    continue
                await slots.acquire()
                task = asyncio.create_task(one(request))
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
            else:
                yield message
    finally:
        # The client went away or the stream ended: nothing of it keeps running.
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
