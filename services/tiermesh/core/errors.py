"""The mesh's error type: one exception carrying the gRPC status code of DESIGN.md's table.

Domain code raises :class:`MeshError`; only servicers turn it into a gRPC status.
"""

from __future__ import annotations

import grpc


class MeshError(Exception):
    """A failure the caller is told about, with a status code and a message for the caller."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        retry_after_ms: int | None = None,
    ) -> None:
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
