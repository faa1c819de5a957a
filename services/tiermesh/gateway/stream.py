"""ModelStreamInfer for non-generative models: each request on the bidirectional stream is
one ModelInfer through the same inference path, answered with one response carrying the
request's id, as soon as it is ready (so not necessarily in the order sent: a client matches
answers by id, as with Triton). A request that fails gets its error in `error_message` and
does not end the stream.

Requests are taken off the stream while fewer than MAX_IN_FLIGHT of its requests are
unanswered; beyond that the stream's flow control holds the client back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import structlog
from tritonclient.grpc import service_pb2

from tiermesh.core.errors import INTERNAL_MESSAGE, MeshError
from tiermesh.core.grpc_errors import REDIS_OUTAGE, REDIS_OUTAGE_MESSAGE
from tiermesh.gateway import converters

if TYPE_CHECKING:
    from tiermesh.gateway.servicer import Caller, InferenceServicer

log = structlog.get_logger("tiermesh.gateway.stream")

MAX_IN_FLIGHT = 64
_END = object()


def _error(request: Any, message: str) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(
        error_message=message,
        infer_response=service_pb2.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


async def _answer(servicer: InferenceServicer, request: Any, caller: Caller) -> Any:
    """The stream response for one request; never raises but for cancellation."""
    try:
        answer = await servicer.infer(
            request.model_name, lambda: converters.infer_request(request), caller
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
    response = converters.infer_response(answer.result, answer.responded_ns, answer.cache_hit)
    return service_pb2.ModelStreamInferResponse(infer_response=response)


async def stream_infer(
    servicer: InferenceServicer,
    requests: AsyncIterator[Any],
    caller: Callable[[], Caller],
) -> AsyncIterator[Any]:
    """The responses of one stream. `caller` is asked at each request (its deadline is
    the stream's time left then)."""
    out: asyncio.Queue[Any] = asyncio.Queue()
    slots = asyncio.Semaphore(MAX_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: Any) -> None:
        try:
            await out.put(await _answer(servicer, request, caller()))
        finally:
            slots.release()

    async def read() -> None:
        try:
            async for request in requests:
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
            yield message
    finally:
        # The client went away or the stream ended: nothing of it keeps running.
        reader.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(reader, *tasks, return_exceptions=True)
