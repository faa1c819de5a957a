"""Who may call each internal gRPC service, by the identity its certificate names.

With internal mutual TLS every internal caller presents a certificate of the mesh's CA;
that only proves it belongs to the mesh. Its identity is the URI in its certificate's
subject alternative names, `spiffe://tiermesh/<service>` (a certificate may name several:
one shared by every service names them all). The router takes jobs only from gateways (and
the Go front door, a gateway in another language), postprocess takes results only from
workers, a Delivery port takes answers only from postprocess and workers (a batch that
needs no postprocessing goes from its worker to its gateway: worker/handoff.py), the
gateway's books only from the front door. Health stays open to any certificate of the CA
(supervisors and probes). Any other method on an internal port is refused: a service added
without a line here fails closed, in the tests that run with mTLS.

A caller whose certificate does not name an allowed identity gets PERMISSION_DENIED before
its call reaches the servicer; a call without TLS on a checked port, UNAUTHENTICATED.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc

IDENTITY_PREFIX = "spiffe://tiermesh/"
GATEWAY = "gateway"
FRONT_DOOR = "frontdoor"
ROUTER = "router"
WORKER = "worker"
POSTPROCESS = "postprocess"
# What a supervisor or an operator presents to ask a service's health.
PROBE = "probe"
IDENTITIES = (GATEWAY, FRONT_DOOR, ROUTER, WORKER, POSTPROCESS, PROBE)

# gRPC service -> the identities that may call it.
CALLERS: Mapping[str, frozenset[str]] = {
    "tiermesh.v1.Router": frozenset({GATEWAY, FRONT_DOOR}),
    "tiermesh.v1.Postprocess": frozenset({WORKER}),
    "tiermesh.v1.Delivery": frozenset({POSTPROCESS, WORKER}),
    "tiermesh.v1.Books": frozenset({FRONT_DOOR}),
}
# gRPC services any certificate of the CA may call.
OPEN = frozenset({"grpc.health.v1.Health"})


def identity_uri(identity: str) -> str:
    return IDENTITY_PREFIX + identity


def identities_of(uris: Iterable[str | bytes]) -> frozenset[str]:
    """The tiermesh identities among a certificate's URI names."""
    found = set()
    for uri in uris:
        text = uri.decode(errors="replace") if isinstance(uri, bytes) else uri
        if text.startswith(IDENTITY_PREFIX):
            found.add(text.removeprefix(IDENTITY_PREFIX))
    return frozenset(found)


def refusal(method: str, auth: Mapping[str, Iterable[bytes]]) -> tuple[grpc.StatusCode, str]:
    """Why a call of `method` (/package.Service/Method) by a peer with this auth context is
    refused; (OK, "") when it is not. Pure: the interceptor below only applies it."""
    service = method.lstrip("/").partition("/")[0]
    if service in OPEN:
        return grpc.StatusCode.OK, ""
    if b"ssl" not in list(auth.get("transport_security_type", ())):
        return grpc.StatusCode.UNAUTHENTICATED, "internal calls need mutual TLS"
    allowed = CALLERS.get(service, frozenset())
    if not allowed:
        return grpc.StatusCode.PERMISSION_DENIED, f"{service} is not an internal service"
    named = identities_of(auth.get("peer_uri", ()))
    if named & allowed:
        return grpc.StatusCode.OK, ""
    return grpc.StatusCode.PERMISSION_DENIED, (
        f"{service} takes calls from {', '.join(identity_uri(i) for i in sorted(allowed))} "
        f"only; the caller's certificate names "
        f"{', '.join(identity_uri(i) for i in sorted(named)) or 'no tiermesh identity'}"
    )


Behavior = Callable[..., Any]


def _guarded(behavior: Behavior, method: str) -> Behavior:
    """`behavior` (a handler's function, of any of gRPC's four kinds) checking its caller
    first; the same kind of function, since grpc.aio picks how to run it by its kind."""

    async def check(context: grpc.aio.ServicerContext) -> None:
        code, message = refusal(method, context.auth_context())
        if code != grpc.StatusCode.OK:
            await context.abort(code, message)

    if inspect.isasyncgenfunction(behavior):

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            async for reply in behavior(request, context):
                yield reply

        return streaming

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(context)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return unary


class CallerCheck(grpc.aio.ServerInterceptor):
    """Refuses a call whose caller's certificate names no identity allowed to make it
    (CALLERS). Costs one auth-context read per call: internal calls are long-lived streams."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.lstrip("/").partition("/")[0] in OPEN:
            return handler
        kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        for kind in kinds:
            behavior = getattr(handler, kind)
            if behavior is not None:
                return handler._replace(**{kind: _guarded(behavior, method)})
        return handler
