"""The KServe v2 REST door of the gateway (aiohttp, in the gateway's process and event loop).

Handlers are transport only: HTTP <-> the domain values of the gateway's data plane
(plane.py). Inference goes through the very path gRPC ModelInfer takes (DataPlane.infer:
auth, tenant limits, validation, cache, routing, metrics, statistics, audit), and every
other method calls the plane's operation the gRPC door calls, so both doors answer alike.
A refusal carries the gRPC table's code as an HTTP status (rest_codec.http_status) and
`{"error": message}`; RESOURCE_EXHAUSTED adds Retry-After. Credentials:
`Authorization: Bearer <key>` (or `x-api-key`), as on gRPC. Each request gets a SERVER
span, continuing the caller's W3C `traceparent` when it sends one.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

# The handler aiohttp uses when a route names none ("100 Continue"), which ours ends with.
from aiohttp.web_urldispatcher import _default_expect_handler
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from tiermesh.core.errors import INTERNAL_MESSAGE, MeshError, invalid
from tiermesh.core.grpc_errors import REDIS_OUTAGE, REDIS_OUTAGE_MESSAGE
from tiermesh.core.settings import GatewaySettings
from tiermesh.core.validation import Screen
from tiermesh.gateway.audit import INFER
from tiermesh.gateway.http_calls import caller_of, json_refusal
from tiermesh.gateway.live_providers import EXECUTION_PROVIDERS_LIVE
from tiermesh.gateway.openai_door import OpenAIDoor, error_response
from tiermesh.gateway.openai_schema import ParamError
from tiermesh.gateway.plane import DataPlane
from tiermesh.gateway.requests import InferRequest
from tiermesh.gateway.rest_codec import (
    HEADER_LENGTH,
    OutputChoice,
    config_doc,
    http_status,
    infer_body,
    json_object,
    metadata_doc,
    parse_infer,
    server_doc,
)

log = structlog.get_logger("tiermesh.gateway.rest")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The OpenAI door's routes (openai_door.py), whose refusals take OpenAI's shape.
OPENAI_PREFIX = "/v1/"


def _json(doc: Any, status: int = 200) -> web.Response:
    return web.json_response(doc, status=status)


def _error(
    status: int, message: str, param: str = "", retry_after_ms: int | None = None
) -> web.Response:
    """The v2 door's refusal, `{"error": message}` (`param` is the OpenAI door's, unused)."""
    return json_refusal({"error": message}, status, retry_after_ms)


# What of a body answered unread aiohttp reads and drops after the answer ("lingering
# close", so that a caller which sends all of its body before reading can read the answer):
# up to this much. Past it the connection closes after the answer instead, as Go's net/http
# does past 256 KiB: reading and dropping costs ~0.5 ms of CPU a MB, and a caller sending
# 200 MB bodies in a loop over loopback made the gateway spend that as fast as it sent.
LINGER_MAX_BYTES = 1 << 20
RST_AVOIDANCE_S = 0.5


def _lingers(request: web.Request) -> bool:
    """Whether what is left of the request's body is small enough to read and drop."""
    if request.content.is_eof():
        return True
    length = request.content_length  # None: chunked, of unknown length
    return length is not None and length - request.content.total_bytes <= LINGER_MAX_BYTES


async def _answer_and_close(request: web.Request, response: web.StreamResponse) -> None:
    """Send the answer and close the connection without reading what is left of the body.
    As Go's net/http does: the answer, then our half of the connection shut (FIN), reading
    paused (what the caller goes on sending fills the windows and stops it), and the close
    RST_AVOIDANCE_S later. A caller that reads while it sends (curl, browsers, asynchronous
    clients) reads the answer in that time: a close at once resets the connection, and the
    reset discards an answer the caller has not read yet. One that reads only once it has
    sent everything sees the connection reset."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    transport = request.transport
    if transport is not None and not transport.is_closing():
        transport.pause_reading()
        if transport.can_write_eof():
            transport.write_eof()
        await asyncio.sleep(RST_AVOIDANCE_S)
    request.protocol.force_close()


def _header_length(request: web.Request) -> int | None:
    value = request.headers.get(HEADER_LENGTH)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise invalid(f"{HEADER_LENGTH} must be an integer") from None


class RestDoor:
    """The REST endpoint; `start` binds it, `stop` closes it after the gateway drained."""

    def __init__(self, plane: DataPlane, settings: GatewaySettings, tracer: trace.Tracer):
        self._plane = plane
        self._settings = settings
        self._tracer = tracer
        self._runner: web.AppRunner | None = None
        self._openai = OpenAIDoor(plane, self._body, self._handled)
        self.app = self._app()

    def _app(self) -> web.Application:
        app = web.Application(
            client_max_size=self._settings.max_request_bytes,
            middlewares=[self._middleware],
        )
        r = app.router
        r.add_get("/v2/health/live", self.live)
        r.add_get("/v2/health/ready", self.ready)
        r.add_get("/v2", self.server_metadata)
        r.add_get("/v2/models/stats", self.stats)
        expect = {"expect_handler": self._expect}
        for base in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            r.add_get(base, self.model_metadata)
            r.add_get(f"{base}/ready", self.model_ready)
            r.add_get(f"{base}/config", self.model_config)
            r.add_get(f"{base}/stats", self.stats)
            r.add_post(f"{base}/infer", self.infer, **expect)
        r.add_post("/v2/repository/index", self.index, **expect)
        r.add_post("/v2/repository/models/{model}/load", self.load, **expect)
        r.add_post("/v2/repository/models/{model}/unload", self.unload, **expect)
        self._openai.add_routes(r, expect)
        return app

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue` (curl sends it before a body over 1 MiB): a body past the
        limit is refused 413 before the caller sends it; otherwise "continue"."""
        if (length := self._oversize(request)) is not None:
            limit = self._settings.max_request_bytes
            error = error_response if request.path.startswith(OPENAI_PREFIX) else _error
            response = error(413, f"the request body ({length} bytes) is over the limit ({limit})")
            await _answer_and_close(request, response)
            return response
        await _default_expect_handler(request)
        return None

    def _oversize(self, request: web.Request) -> int | None:
        """The request's Content-Length where it is past the limit, else None."""
        length = request.content_length
        return length if length is not None and length > self._settings.max_request_bytes else None

    async def start(self) -> int:
        """Listen on http_host:http_port (0 picks a port); return the port bound."""
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            # A caller that hangs up cancels its request, as a cancelled gRPC call does.
            handler_cancellation=True,
            max_field_size=self._settings.max_metadata_bytes,
            # aiohttp holds an idle connection an hour by default, and this same timer is
            # all that ends one whose request headers never finish.
            keepalive_timeout=self._settings.idle_connection_s,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self._settings.http_host,
            self._settings.http_port,
            ssl_context=_ssl_context(self._settings),
        )
        await site.start()
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _key_first(self, request: web.Request, operation: str, model: str = "") -> None:
        """The caller's key before its body: a stranger's 64 MiB is never read. A refusal
        here is counted and audited as the data plane's own (`refused_unread`)."""
        caller = caller_of(request)
        try:
            if operation == INFER:
                self._plane.authorize(caller, model)
            else:
                self._plane.authenticate(caller)
        except MeshError as err:
            self._plane.refused_unread(caller, operation, model, err)
            raise

    async def _optional_json(
        self, request: web.Request, operation: str, model: str = ""
    ) -> dict[str, Any]:
        """The JSON object of a body that may be empty, read once its caller's key passed."""
        self._key_first(request, operation, model)
        body = await self._body(request)
        return json_object(body) if body.strip() else {}

    async def _body(self, request: web.Request) -> bytes:
        """The body, or 413 from its Content-Length alone when that is past the limit: a
        body that is too large is not read into memory first (aiohttp would read up to the
        limit before refusing; what is left it reads and drops while the caller sends)."""
        if (length := self._oversize(request)) is not None:
            limit = self._settings.max_request_bytes
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=length)
        return await request.read()

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """One SERVER span per request; every failure as `{"error": ...}` with its status."""
        route = request.match_info.route.resource
        name = f"{request.method} {route.canonical if route else request.path}"
        parent = propagate.extract(dict(request.headers))
        with self._tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER) as span:
            if not span.is_recording():  # not traced: nothing to build for the span
                return await self._answer(request, handler)
            span.set_attribute("http.request.method", request.method)
            span.set_attribute("url.path", request.path)
            response = await self._answer(request, handler)
            span.set_attribute("http.response.status_code", response.status)
            if response.status >= 500:
                span.set_status(Status(StatusCode.ERROR))
            return response

    async def _answer(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await self._handled(request, handler)
        if not _lingers(request):
            await _answer_and_close(request, response)
        return response

    async def _handled(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's answer, or its failure as a refusal in its door's shape (the
        OpenAI door's for its routes, with the field a ParamError names)."""
        error = error_response if request.path.startswith(OPENAI_PREFIX) else _error
        try:
            return await handler(request)
        except MeshError as err:
            param = err.param if isinstance(err, ParamError) else ""
            return error(http_status(err.code), err.message, param, err.retry_after_ms)
        except web.HTTPException as exc:  # unknown route, method, body too large
            return error(exc.status, exc.reason)
        except asyncio.CancelledError:
            raise
        except REDIS_OUTAGE:
            return error(503, REDIS_OUTAGE_MESSAGE)
        except Exception:
            log.exception("unexpected error", path=request.path)
            return error(500, INTERNAL_MESSAGE)

    # -- handlers ----------------------------------------------------------------------

    async def live(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200)

    async def ready(self, request: web.Request) -> web.StreamResponse:
        return web.Response(status=200 if await self._plane.server_ready() else 503)

    async def server_metadata(self, request: web.Request) -> web.StreamResponse:
        return _json(server_doc(self._plane.server_metadata()))

    async def model_metadata(self, request: web.Request) -> web.StreamResponse:
        name, version = _model(request)
        return _json(metadata_doc(self._plane.model(caller_of(request), name, version)))

    async def model_ready(self, request: web.Request) -> web.StreamResponse:
        name, version = _model(request)
        ready = await self._plane.model_ready(caller_of(request), name, version)
        return web.Response(status=200 if ready else 400)

    async def model_config(self, request: web.Request) -> web.StreamResponse:
        name, version = _model(request)
        cfg = self._plane.model(caller_of(request), name, version)
        doc = config_doc(cfg)
        live = await self._plane.providers_live(cfg, version)
        if live is not None:  # as the gRPC door's parameter reads in JSON
            doc.setdefault("parameters", {})[EXECUTION_PROVIDERS_LIVE] = {"string_value": live}
        return _json(doc)

    async def stats(self, request: web.Request) -> web.StreamResponse:
        name, version = _model(request)
        docs = await self._plane.statistics_docs(caller_of(request), name, version)
        return _json({"model_stats": docs})

    async def index(self, request: web.Request) -> web.StreamResponse:
        doc = await self._optional_json(request, "")
        if doc.get("repository_name"):
            raise invalid("this server has one model repository, named ''")
        return _json(await self._plane.index_docs(caller_of(request), doc.get("ready") is True))

    async def load(self, request: web.Request) -> web.StreamResponse:
        doc = await self._optional_json(request, "load", request.match_info["model"])
        params = doc.get("parameters") or {}
        if not isinstance(params, dict) or set(params) - {"version"}:
            raise invalid(
                "load parameters are not supported: models load from the repository as "
                "committed (only 'version' may be given)"
            )
        version = params.get("version", "")
        await self._plane.load(caller_of(request), request.match_info["model"], str(version))
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.StreamResponse:
        doc = await self._optional_json(request, "unload", request.match_info["model"])
        params = doc.get("parameters") or {}
        version = str(params.get("version", "")) if isinstance(params, dict) else ""
        await self._plane.unload(caller_of(request), request.match_info["model"], version)
        return web.Response(status=200)

    async def infer(self, request: web.Request) -> web.StreamResponse:
        name, version = _model(request)
        header_length = _header_length(request)
        self._key_first(request, INFER, name)
        body = await self._body(request)
        chosen: list[OutputChoice] = []

        def parse(screen: Screen) -> InferRequest:
            req, choice = parse_infer(body, header_length, name, version, screen)
            chosen.append(choice)
            return req

        answer = await self._plane.infer(name, parse, caller_of(request))
        data, json_length = infer_body(
            answer.result, answer.responded_ns, answer.cache_hit, chosen[0]
        )
        if json_length is None:
            response = web.Response(body=data, content_type="application/json")
        else:
            response = web.Response(body=data, content_type="application/octet-stream")
            response.headers[HEADER_LENGTH] = str(json_length)
        if request.headers.get("Accept-Encoding"):
            response.enable_compression()
        return response


def _model(request: web.Request) -> tuple[str, str]:
    """The model's name and version in the path ("" where the route has none)."""
    return request.match_info.get("model", ""), request.match_info.get("version", "")


def _ssl_context(settings: GatewaySettings) -> ssl.SSLContext | None:
    """TLS for the REST door from the public port's certificate, when it has one."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file is not None:
        context.load_verify_locations(settings.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
