"""Turning domain errors into gRPC statuses at the servicer edge; nothing else leaks."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from redis import exceptions as redis_errors

from tiermesh.core.errors import INTERNAL_MESSAGE, RETRY_AFTER_KEY, MeshError

# Redis down, restarting, loading its AOF or not answering: the caller may retry soon.
REDIS_OUTAGE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
)
REDIS_OUTAGE_MESSAGE = "queue store unavailable (redis down or loading); retry shortly"

log = structlog.get_logger("tiermesh.grpc")

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Method = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]


def trailers_of(err: MeshError) -> tuple[tuple[str, str], ...]:
    if err.retry_after_ms is None:
        return ()
    return ((RETRY_AFTER_KEY, str(err.retry_after_ms)),)


def mesh_error_from_rpc(err: grpc.aio.AioRpcError) -> MeshError:
    """The MeshError an internal call's failure stands for, retry-after trailer included."""
    retry_after: int | None = None
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                retry_after = int(value)
            except (TypeError, ValueError):
                retry_after = None
    return MeshError(err.code(), err.details() or err.code().name, retry_after_ms=retry_after)


def fail_call(
    context: grpc.aio.ServicerContext,
    code: grpc.StatusCode,
    message: str,
    trailers: tuple[tuple[str, str], ...] = (),
) -> Any:
    """End the call with `code` by setting the status and returning no message.

    Not context.abort(): abort raises, and the OpenTelemetry server interceptor then
    records the exception with a formatted traceback on every refused call, which made a
    refusal cost nearly as much gateway CPU as an answer, exactly when the gateway is
    shedding load. The interceptor still sees the code (it wraps set_code)."""
    context.set_code(code)
    context.set_details(message)
    if trailers:
        context.set_trailing_metadata(trailers)
    return None


def grpc_method(fn: Method[Req, Resp]) -> Method[Req, Resp]:
    """Wrap a servicer method: MeshError -> its status; a Redis outage -> UNAVAILABLE;
    anything unexpected -> INTERNAL."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext) -> Resp:
        try:
            return await fn(self, request, context)
        except MeshError as err:
            return fail_call(context, err.code, err.message, trailers_of(err))  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            raise
        except REDIS_OUTAGE as exc:
            log.warning("redis unavailable", method=fn.__name__, error=type(exc).__name__)
            return fail_call(context, grpc.StatusCode.UNAVAILABLE, REDIS_OUTAGE_MESSAGE)  # type: ignore[no-any-return]
        except Exception:
            log.exception("unexpected error", method=fn.__name__)
            return fail_call(context, grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)  # type: ignore[no-any-return]

    return wrapper
