"""The SERVER span of each public gRPC call, where the gateway exports: the span the
OpenTelemetry gRPC server interceptor would record (name `/inference.GRPCInferenceService/
<Method>`, rpc.* attributes, the status code, the caller's W3C context as parent), at a
fraction of its cost. An interceptor puts every call through a Python continuation and a new
method handler even when it records nothing; here the method's own handler is wrapped once,
when the servicer is registered, and a call costs one span (DESIGN.md, "What a request may
cost": tracing every request within 0.3 ms).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from tiermesh.core.telemetry import w3c_context

Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


def call_span_of(service: str, method: str) -> tuple[str, dict[str, str]]:
    """The name and rpc.* attributes of a call's SERVER span (also written for the calls
    the front door answered: books.py)."""
    return f"/{service}/{method}", {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": method,
    }


def call_status(code: grpc.StatusCode, details: str) -> Status | None:
    """The span status of a call that ended with `code`: None (unset) for OK, else an error
    naming the code and the details (also for the calls the front door answered)."""
    return (
        None if code == grpc.StatusCode.OK else Status(StatusCode.ERROR, f"{code.name}: {details}")
    )


class CallSpans:
    """Wraps the public servicers' method handlers with their calls' spans."""

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def wrap(self, service: str, method: str, handler: Any) -> Any:
        """The handler of `method` with a span per call (unary or response-streaming)."""
        name, attributes = call_span_of(service, method)
        if handler.response_streaming:
            field = "stream_stream" if handler.stream_stream else "unary_stream"
            wrapped: Any = self._streaming(name, attributes, getattr(handler, field))
        else:
            field = "unary_unary" if handler.unary_unary else "stream_unary"
            wrapped = self._unary(name, attributes, getattr(handler, field))
        return handler._replace(**{field: wrapped})

    def _start(
        self, name: str, attributes: dict[str, str], context: grpc.aio.ServicerContext
    ) -> trace.Span:
        carrier = w3c_context(context.invocation_metadata() or ())
        parent = propagate.extract(carrier) if carrier else None
        return self._tracer.start_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        )

    def _unary(self, name: str, attributes: dict[str, str], behavior: Unary) -> Unary:
        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            span = self._start(name, attributes, context)
            with trace.use_span(span, end_on_exit=True, record_exception=False):
                try:
                    response = await behavior(request, context)
                except BaseException as exc:
                    _ended(span, context, _escaped(exc))
                    raise
                _ended(span, context)
                return response

        return traced

    def _streaming(self, name: str, attributes: dict[str, str], behavior: Streaming) -> Streaming:
        async def traced(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            span = self._start(name, attributes, context)
            with trace.use_span(span, end_on_exit=True, record_exception=False):
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as exc:
                    _ended(span, context, _escaped(exc))
                    raise
                _ended(span, context)

        return traced


def _escaped(exc: BaseException) -> grpc.StatusCode:
    """The status grpc gives a call whose method raised `exc`."""
    return (
        grpc.StatusCode.CANCELLED
        if isinstance(exc, asyncio.CancelledError)
        else grpc.StatusCode.UNKNOWN
    )


def _ended(
    span: trace.Span,
    context: grpc.aio.ServicerContext,
    unset: grpc.StatusCode = grpc.StatusCode.OK,
) -> None:
    """The call's status on its span: as the servicer set it, else `unset` (OK for a
    method that returned, else as grpc ends a call whose method raised)."""
    if not span.is_recording():
        return
    code = context.code() or unset
    if isinstance(code, int):  # grpc.aio gives the status as its integer value
        code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if (status := call_status(code, context.details() or "")) is not None:
        span.set_status(status)


def add_servicer(
    add: Callable[[Any, Any], None],
    servicer: Any,
    server: grpc.aio.Server,
    spans: CallSpans | None,
    adapt: Callable[[Any], Any] = lambda handler: handler,
) -> None:
    """Register `servicer` as the generated `add_...Servicer_to_server` function `add`
    would, each method handler changed by `adapt` and, with `spans`, given its span."""
    capture = _Capture()
    add(servicer, capture)
    for service, found in capture.services.items():
        handlers = {name: adapt(h) for name, h in found.items()}
        if spans is not None:
            handlers = {name: spans.wrap(service, name, h) for name, h in handlers.items()}
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        server.add_registered_method_handlers(service, handlers)


class _Capture:
    """Collects the method handlers a generated `add_...Servicer_to_server` would add."""

    def __init__(self) -> None:
        self.services: dict[str, dict[str, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        pass  # the same handlers also come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.services.setdefault(service, {}).update(handlers)
