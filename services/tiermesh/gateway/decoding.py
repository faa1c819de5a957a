"""The public port's requests before they are messages: inflated within a bound, parsed, or
refused with a code of DESIGN.md's table.

grpc answers a request its deserializer cannot parse (bytes that are not the message, a
string field that is not UTF-8) with UNKNOWN and the parser's exception in the details,
a code DESIGN.md's table does not have and a detail that should stay in the server.
And grpc inflates a compressed message whole before it compares its size with the message
limit: 1 MB of gzip is 1 GiB in the gateway's memory before the refusal. So the public
server hands its handlers messages as they came (`PUBLIC_SERVER_OPTIONS`), and each
method's deserializer here inflates a compressed one itself, stopping at
`max_request_bytes`, in a thread, as it reads any large request (the deserializer hands the
guard in front of the method a `_Deferred` marker): the event loop serves other calls
meanwhile.

:func:`add_public_servicer` registers a servicer as its generated function does, except
that each deserializer hands a request it refuses on as a `Refused` marker, and a guard in
front of the method ends the call with the marker's code (a stream of requests: the
marker reaches the method, which answers it on the stream or ends the call).
"""

from __future__ import annotations

import asyncio
import inspect
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tiermesh.core.errors import MeshError
from tiermesh.core.grpc_errors import fail_call
from tiermesh.gateway import wire_scan
from tiermesh.gateway.call_spans import CallSpans, add_servicer

UNDECODABLE_MESSAGE = (
    "the request is not a valid message of the KServe v2 protocol (it does not parse, or a "
    "string field is not UTF-8)"
)


# Let handlers inflate: grpc's own inflation has no bound below the message limit's check.
PUBLIC_SERVER_OPTIONS = (("grpc.per_message_decompression", 0),)

_GZIP_MAGIC = b"\x1f\x8b"  # field 3 with wire type 7, which protobuf does not have


@dataclass(frozen=True, slots=True)
class Refused:
    """Stands for a request refused before it was a message."""

    code: grpc.StatusCode
    message: str

    def error(self) -> MeshError:
        return MeshError(self.code, self.message)


_UNDECODABLE = Refused(grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE_MESSAGE)


def _zlib_framed(data: bytes) -> bool:
    """RFC 1950's header (grpc's "deflate"): deflate, a window <= 32 KiB, a valid check."""
    return (
        len(data) >= 2
        and data[0] & 0x0F == 8
        and data[0] >> 4 <= 7
        and (data[0] << 8 | data[1]) % 31 == 0
    )


def inflated(data: bytes, limit: int) -> bytes | Refused:
    """The message in `data`: as it came, or inflated (gzip, zlib) to at most `limit`
    bytes. A message of the KServe protocol never starts with gzip's magic bytes; one may
    start like a zlib header, so bytes that do not inflate as zlib are the message itself."""
    gzip = data[:2] == _GZIP_MAGIC
    if not gzip and not _zlib_framed(data):
        return data
    inflater = zlib.decompressobj(31 if gzip else 15)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error:
        return _UNDECODABLE if gzip else data
    if len(out) > limit:
        return Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the request inflates past {limit} bytes, the limit of a request "
            "(TIERMESH_MAX_REQUEST_BYTES); send a smaller one",
        )
    if not inflater.eof or inflater.unused_data:
        return _UNDECODABLE if gzip else data
    return out


Behavior = Callable[[Any, grpc.aio.ServicerContext], Any]


# A request this large (or compressed) is read in a thread: the wire scan walking 64 Ki
# framed elements of an 8 MB request held the loop ~30 ms at once (legitimate p99 6.5 ->
# 44.9 ms under a repeated one); in a thread the loop has the GIL back every 5 ms.
_READ_INLINE_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class _Deferred:
    """A request as it came, too costly to read on the event loop: inflated, scanned and
    parsed by `read` in a thread (`_ready`), where zlib lets the loop run (8 MiB of a bomb
    held it ~20 ms) and Python's switch interval gives it the GIL back."""

    data: bytes
    read: Callable[[bytes], Any]


def _reading(deserialize: Callable[[bytes], Any], limit: int) -> Callable[[bytes], Any]:
    # A KServe request's listed elements are counted before protobuf builds them.
    scanned = deserialize == service_pb2.ModelInferRequest.FromString

    def parse(data: bytes) -> Any:
        message = inflated(data, limit)
        if isinstance(message, Refused):
            return message
        if scanned and (err := wire_scan.check(message)) is not None:
            return Refused(err.code, err.message)
        try:
            return deserialize(message)
        except DecodeError:
            return _UNDECODABLE

    def read(data: bytes) -> Any:
        if len(data) > _READ_INLINE_BYTES or data[:2] == _GZIP_MAGIC or _zlib_framed(data):
            return _Deferred(data, parse)
        return parse(data)

    return read


async def _ready(request: Any) -> Any:
    """The request as a message (or Refused): a large or compressed one read in a thread."""
    if isinstance(request, _Deferred):
        return await asyncio.to_thread(request.read, request.data)
    return request


async def _each_ready(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        yield await _ready(request)


def _streamed(behavior: Behavior) -> Behavior:
    """A stream of requests handed on as messages (or Refused: the method answers them)."""
    if inspect.isasyncgenfunction(behavior):

        async def generator(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            async for response in behavior(_each_ready(requests), context):
                yield response

        return generator

    async def coroutine(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(_each_ready(requests), context)

    return coroutine


def _guarded(behavior: Behavior) -> Behavior:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        request = await _ready(request)
        if isinstance(request, Refused):
            return fail_call(context, request.code, request.message)
        return await behavior(request, context)

    return guarded


def _guarded_stream(behavior: Behavior) -> Behavior:
    """A unary request answered with a stream: a refused request ends it before its first."""

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        request = await _ready(request)
        if isinstance(request, Refused):
            fail_call(context, request.code, request.message)
            return
        async for response in behavior(request, context):
            yield response

    return guarded


def _guard(limit: int) -> Callable[[Any], Any]:
    """Each handler with the bounded reader; a unary request's with a guard."""

    def guard(handler: Any) -> Any:
        handler = handler._replace(
            request_deserializer=_reading(handler.request_deserializer, limit)
        )
        if handler.request_streaming:  # the method sees each Refused in its stream (stream.py)
            if handler.response_streaming:
                return handler._replace(stream_stream=_streamed(handler.stream_stream))
            return handler._replace(stream_unary=_streamed(handler.stream_unary))
        if handler.response_streaming:
            return handler._replace(unary_stream=_guarded_stream(handler.unary_stream))
        return handler._replace(unary_unary=_guarded(handler.unary_unary))

    return guard


async def messages(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A stream of requests whose first refused one ends the call with its code."""
    async for request in requests:
        if isinstance(request, Refused):
            raise request.error()
        yield request


def add_public_servicer(
    add: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    spans: CallSpans | None,
    max_request_bytes: int,
) -> None:
    """The generated `add_...Servicer_to_server` function `add` on the public port: with
    requests inflated within `max_request_bytes`, those that do not parse answered
    INVALID_ARGUMENT instead of grpc's UNKNOWN, and with `spans` (the gateway exports) a
    SERVER span per call."""
    add_servicer(add, servicer, server, spans, _guard(max_request_bytes))


def add_inference_servicer(
    servicer: Any,
    server: grpc.aio.Server,
    spans: CallSpans | None = None,
    max_request_bytes: int = 8 << 20,
) -> None:
    """`service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server` as a public servicer."""
    add_public_servicer(
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
        servicer,
        server,
        spans,
        max_request_bytes,
    )
