"""Public requests that do not even parse are malformed input: INVALID_ARGUMENT.

grpc answers a request its deserializer cannot parse (bytes that are not the message, a
string field that is not UTF-8) with UNKNOWN and the parser's exception in the details,
a code DESIGN.md's table does not have and a detail that should stay in the server.
:func:`add_inference_servicer` registers the KServe servicer as tritonclient's generated
function does, except that each unary method's deserializer hands an unparseable request
on as a marker, and a guard in front of the method aborts it with INVALID_ARGUMENT.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from tritonclient.grpc import service_pb2_grpc

from tiermesh.core.grpc_errors import fail_call
from tiermesh.gateway.call_spans import CallSpans, add_servicer

UNDECODABLE_MESSAGE = (
    "the request is not a valid message of the KServe v2 protocol (it does not parse, or a "
    "string field is not UTF-8)"
)


class _Undecodable:
    """Stands for a request that did not parse."""


_UNDECODABLE = _Undecodable()

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def _lenient(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def lenient(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return _UNDECODABLE

    return lenient


def _guarded(behavior: Behavior) -> Behavior:
    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request is _UNDECODABLE:
            return fail_call(context, grpc.StatusCode.INVALID_ARGUMENT, UNDECODABLE_MESSAGE)
        return await behavior(request, context)

    return guarded


def _guard(handler: Any) -> Any:
    """The unary-unary handler with a lenient deserializer and a guard; others unchanged."""
    if handler.request_streaming or handler.response_streaming:
        return handler
    return handler._replace(
        request_deserializer=_lenient(handler.request_deserializer),
        unary_unary=_guarded(handler.unary_unary),
    )


def add_inference_servicer(
    servicer: Any, server: grpc.aio.Server, spans: CallSpans | None = None
) -> None:
    """`service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server`, with unparseable
    requests answered INVALID_ARGUMENT instead of grpc's UNKNOWN, and with `spans` (the
    gateway exports) a SERVER span per call."""
    add_servicer(
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, servicer, server, spans, _guard
    )
