"""The mesh's error type: one exception carrying the gRPC status code of DESIGN.md's table.

Domain code raises :class:`MeshError`; only servicers turn it into a gRPC status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import grpc

MAX_MESSAGE_CHARS = 1024


# A caller-supplied name (a model, a request id) as records keep it (audit, capture, span
# attributes): cut to this many characters; they are records, not dumps.
MAX_RECORDED_NAME = 256


def shown(text: str, limit: int = 64) -> str:
    """A caller-supplied string as an error message quotes it: control characters escaped,
    cut to `limit` characters (a model name may be megabytes of anything)."""
    head = text[:limit]  # never escape (or copy) megabytes to show 64 characters
    out = head if head.isprintable() else head.encode("unicode_escape").decode("ascii")
    if len(text) <= limit and len(out) <= limit:
        return out
    return f"{out[:limit]}... ({len(text)} characters)"


def shown_shape(shape: Sequence[int], limit: int = 8) -> str:
    """A caller-supplied shape as an error message quotes it (at most `limit` dimensions)."""
    dims = [str(d) for d in shape[:limit]]
    if len(shape) > limit:
        dims.append(f"... ({len(shape)} dimensions)")
    return "[" + ", ".join(dims) + "]"


class MeshError(Exception):
    """A failure the caller is told about, with a status code and a message for the caller."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        retry_after_ms: int | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            # The message travels in the trailers, which clients cap at 8 KiB by default; one
            # quoting a huge client-supplied value would turn into a RESOURCE_EXHAUSTED there.
            message = message[:MAX_MESSAGE_CHARS] + "..."
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_ms = retry_after_ms

    def __repr__(self) -> str:
        return f"MeshError({self.code.name}, {self.message!r})"


def invalid(message: str) -> MeshError:
    return MeshError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> MeshError:
    return MeshError(grpc.StatusCode.NOT_FOUND, message)


def unknown_model(name: str, version: str = "") -> MeshError:
    """NOT_FOUND for a model (or a version of it) the repository lacks, in Triton's words:
    Triton's clients and example programs look for "Request for unknown model"."""
    which = f"'{shown(name)}'" + (f" version {shown(version)}" if version else "")
    return not_found(f"Request for unknown model: {which} is not found")


def not_gated(model: str, variant: str, version: str, serving: list[str]) -> MeshError:
    """INVALID_ARGUMENT for a named variant without a passing accuracy-gate record in the
    version that would answer (core/gates.py): it answers nobody."""
    return invalid(
        f"variant '{shown(variant)}' of model '{model}' version {shown(version)} has no "
        "passing accuracy-gate record, so it does not serve (`tiermesh models verify` shows "
        f"why; variants that serve: {', '.join(sorted(serving))})"
    )


def unavailable(message: str) -> MeshError:
    return MeshError(grpc.StatusCode.UNAVAILABLE, message)


def deadline_exceeded(message: str = "deadline exceeded") -> MeshError:
    return MeshError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def exhausted(message: str, retry_after_ms: int) -> MeshError:
    return MeshError(grpc.StatusCode.RESOURCE_EXHAUSTED, message, retry_after_ms=retry_after_ms)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def code_from_int(value: int) -> grpc.StatusCode:
    """The StatusCode for its integer value (as carried in tiermesh.v1.Result.code)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def code_to_int(code: grpc.StatusCode) -> int:
    return int(code.value[0])


RETRY_AFTER_KEY = "retry-after-ms"
INTERNAL_MESSAGE = "internal error"


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The status a call that raised `exc` ends with: a refusal's own code, CANCELLED for a
    cancellation, INTERNAL for anything else."""
    if isinstance(exc, MeshError):
        return exc.code
    if isinstance(exc, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.INTERNAL
