"""Refusals in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
status of the mesh's one table (rest_codec.http_status), which the OpenAI clients turn into
their typed exceptions (400 BadRequestError, 401 AuthenticationError, 403
PermissionDeniedError, 404 NotFoundError, 429 RateLimitError, 5xx InternalServerError).
Pure."""

from __future__ import annotations

from typing import Any

# OpenAI's `type` and `code` of an error, by HTTP status.
_KINDS: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "model_not_allowed"),
    404: ("invalid_request_error", "model_not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("server_error", "aborted"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    499: ("invalid_request_error", "cancelled"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}


def error_document(status: int, message: str, param: str = "") -> dict[str, Any]:
    kind, code = _KINDS.get(status, ("server_error", None))
    if status == 404 and "model" not in message:
        code = "not_found"  # a route, not a model
    return {"error": {"message": message, "type": kind, "param": param or None, "code": code}}


def sse_error(status: int, message: str) -> dict[str, Any]:
    """An error after a stream's first event (its status is sent): as an event."""
    doc = error_document(status, message)
    doc["error"]["status"] = status
    return doc
