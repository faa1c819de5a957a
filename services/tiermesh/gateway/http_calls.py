"""What both HTTP doors of the gateway (KServe v2 REST, rest.py; OpenAI, openai_door.py) need
of an aiohttp request and a refusal: the data plane's Caller of a request, and a JSON
refusal with its status and, for RESOURCE_EXHAUSTED, Retry-After."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tiermesh.core.errors import RETRY_AFTER_KEY
from tiermesh.gateway.plane import Caller
from tiermesh.gateway.rest_codec import retry_after_s


def caller_of(request: web.Request) -> Caller:
    """The caller of an HTTP request: its headers (the credentials), no transport deadline."""
    metadata = tuple((k.lower(), v) for k, v in request.headers.items())
    return Caller(metadata, None, f"http:{request.remote or ''}")


def json_refusal(doc: Any, status: int, retry_after_ms: int | None = None) -> web.Response:
    """A refusal's JSON document with its status; Retry-After (whole seconds, and the mesh's
    own milliseconds) when the caller is told when to come back."""
    response = web.json_response(doc, status=status)
    if retry_after_ms is not None:
        response.headers["Retry-After"] = str(retry_after_s(retry_after_ms))
        response.headers[RETRY_AFTER_KEY] = str(retry_after_ms)
    return response
