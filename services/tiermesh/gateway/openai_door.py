"""The OpenAI door of the gateway: `/v1/models`, `/v1/embeddings`, `/v1/chat/completions` and
`/v1/completions` on the REST door's port (aiohttp), for the clients written against OpenAI's
API (the `openai` packages, LangChain's and LlamaIndex's OpenAI classes).

Transport only, over the data plane's one inference path (credentials, tenant limits,
validation, the response cache, routing, metrics, statistics, audit, spans): an embeddings
list is one call of several jobs (plane.infer_many; rows grouped by length,
openai_embeddings.py), a chat or completion one generation job, streamed as server-sent
events when asked. A caller who hangs up cancels its jobs, as on gRPC. Refusals in OpenAI's
error shape (openai_errors.py). What OpenAI has no field for travels in headers:
`x-tiermesh-priority` (1 = highest, 0 = the model's default), `x-tiermesh-timeout-ms` (the
request's deadline), `x-request-id` (the caller's id, echoed back); each answer's time
breakdown comes back as `x-tiermesh-<fact>` headers (`x-tiermesh-queue-ms`, ...).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import numpy as np
import structlog
from aiohttp import web

from tiermesh.core.controls import NO_CONTROLS, Controls
from tiermesh.core.errors import INTERNAL_MESSAGE, MeshError, unknown_model
from tiermesh.core.grpc_errors import REDIS_OUTAGE, REDIS_OUTAGE_MESSAGE
from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import TOO_LONG
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tensors import to_numpy
from tiermesh.core.validation import Screen
from tiermesh.gateway.audit import INFER
from tiermesh.gateway.dispatch import Answer
from tiermesh.gateway.facts import RESPONSE_PREFIX, response_facts
from tiermesh.gateway.generation import TextCursor
from tiermesh.gateway.http_calls import caller_of, json_refusal
from tiermesh.gateway.openai_chat import (
    Completion,
    Headers,
    chat_request,
    completion_request,
    finish_reason_of,
    openai_param,
    usage_of,
)
from tiermesh.gateway.openai_embeddings import Rows, document, embeds, rows, text_tokens, vectors
from tiermesh.gateway.openai_errors import error_document, sse_error
from tiermesh.gateway.openai_schema import (
    ChatBody,
    CompletionBody,
    EmbeddingsBody,
    ParamError,
    param_error,
    parsed,
)
from tiermesh.gateway.plane import Caller, DataPlane
from tiermesh.gateway.requests import InferRequest
from tiermesh.gateway.rest_codec import http_status
from tiermesh.generate.tensors import output_text

log = structlog.get_logger("tiermesh.gateway.openai")

PRIORITY_HEADER = "x-tiermesh-priority"
TIMEOUT_HEADER = "x-tiermesh-timeout-ms"
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ReadBody = Callable[[web.Request], Awaitable[bytes]]
Handled = Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]


def error_response(
    status: int, message: str, param: str = "", retry_after_ms: int | None = None
) -> web.Response:
    return json_refusal(error_document(status, message, param), status, retry_after_ms)


class OpenAIDoor:
    """Built by the REST door, which routes `/v1/...` here, reads bodies for it and turns
    every failure into a refusal (`handled`: the REST door's one ladder of errors, which
    renders `/v1` refusals with `error_response`)."""

    def __init__(self, plane: DataPlane, read_body: ReadBody, handled: Handled) -> None:
        self._plane = plane
        self._read_body = read_body
        self._handled = handled
        self._created = int(time.time())

    def add_routes(self, router: web.UrlDispatcher, expect: dict[str, Any]) -> None:
        router.add_get("/v1/models", self._counted("models", self.models))
        router.add_get("/v1/models/{model}", self._counted("models", self.model))
        router.add_post("/v1/embeddings", self._counted("embeddings", self.embeddings), **expect)
        chat = self._counted("chat.completions", self.chat)
        router.add_post("/v1/chat/completions", chat, **expect)
        router.add_post("/v1/completions", self._counted("completions", self.completions), **expect)

    def _counted(self, endpoint: str, handler: Handler) -> Handler:
        """The handler, its refusals in OpenAI's shape, each call counted by status."""

        async def counted(request: web.Request) -> web.StreamResponse:
            response = await self._handled(request, handler)
            model = request.get("model", "")
            known = model if model and self._plane.config(model) is not None else "unknown"
            status = str(response.status)
            self._plane.metrics.openai_calls.labels(endpoint, known, status).inc()
            return response

        return counted

    # -- models -----------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.StreamResponse:
        served = [self._model_doc(cfg) for cfg in self._served(caller_of(request))]
        return web.json_response({"object": "list", "data": served})

    async def model(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        for cfg in self._served(caller_of(request)):
            if cfg.name == name:
                return web.json_response(self._model_doc(cfg))
        raise unknown_model(name)

    def _served(self, caller: Caller) -> list[ModelConfig]:
        """The models this door serves that the caller may use, by name."""
        visible = self._plane.visible(caller)
        return sorted(
            (c for c in visible if embeds(c) or c.generation is not None), key=lambda c: c.name
        )

    def _model_doc(self, cfg: ModelConfig) -> dict[str, Any]:
        return {"id": cfg.name, "object": "model", "created": self._created, "owned_by": "tiermesh"}

    # -- embeddings -------------------------------------------------------------------

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = parsed(EmbeddingsBody, await self._body(request))
        request["model"] = body.model
        headers = _headers(request)
        planned: list[Rows] = []

        def parse(screen_of: Callable[[str], Screen]) -> Sequence[InferRequest]:
            cfg = self._kind(body.model, embeds, "embeddings")
            plan = rows(body, cfg, self._ids_model(cfg))
            planned.append(plan)
            screen = screen_of(plan.model)
            out = []
            for inputs, _ in plan.jobs:
                for t in inputs:
                    screen(t.name, t.datatype, t.shape)
                out.append(
                    _infer_request(plan.model, inputs, headers, whole_text=not plan.id_tokens)
                )
            return out

        try:
            answers = await self._plane.infer_many(body.model, parse, caller_of(request))
        except ParamError:
            raise
        except MeshError as err:
            if err.code == grpc.StatusCode.INVALID_ARGUMENT and err.message.startswith(TOO_LONG):
                raise ParamError("input", err.message) from None  # found as the router tokenized
            raise
        plan = planned[0]
        self._plane.metrics.openai_rows.labels(body.model).inc(plan.count)
        parts = []
        for answer, (_, positions) in zip(answers, plan.jobs, strict=True):
            tensor = next(t for t in answer.result.outputs if t.name == plan.output)
            parts.append((to_numpy(tensor).astype(np.float32, copy=False), positions))
        tokens = plan.id_tokens or text_tokens([a.result.annotations for a in answers])
        doc = document(
            vectors(parts, plan.count, body.dimensions), body.encoding_format, body.model, tokens
        )
        response = web.json_response(doc)
        _timing_headers(response, max(answers, key=lambda a: a.responded_ns))
        _id_header(response, request, answers[0].result.request_id)
        if request.headers.get("Accept-Encoding"):
            response.enable_compression()
        return response

    def _ids_model(self, cfg: ModelConfig) -> ModelConfig | None:
        """The model's companion that takes token ids, if it has one."""
        for other in self._plane.models():
            if other.companion_of == cfg.name and {t.name for t in other.inputs} == {
                "input_ids",
                "attention_mask",
            }:
                return other
        return None

    def _kind(self, name: str, serves: Callable[[ModelConfig], bool], what: str) -> ModelConfig:
        cfg = self._plane.find(name)
        if not serves(cfg):
            raise param_error("model", f"model '{name}' does not serve {what}")
        return cfg

    # -- chat and completions ---------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = parsed(ChatBody, await self._body(request))
        return await self._generate(request, body, True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = parsed(CompletionBody, await self._body(request))
        return await self._generate(request, body, False)

    async def _generate(
        self, request: web.Request, body: ChatBody | CompletionBody, chat: bool
    ) -> web.StreamResponse:
        request["model"] = body.model
        headers = _headers(request)
        what = "chat completions" if chat else "completions"

        def parse(screen: Screen) -> InferRequest:
            self._kind(body.model, lambda c: c.generation is not None, what)
            if isinstance(body, ChatBody):
                return chat_request(body, headers)
            return completion_request(body, headers)

        completion = Completion(
            chat,
            ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            int(time.time()),
            body.model,
        )
        caller = caller_of(request)
        if body.stream:
            usage = body.stream_options is not None and body.stream_options.include_usage
            return await self._stream(request, body.model, parse, caller, completion, usage)
        answer = await _generation(self._plane.infer(body.model, parse, caller))
        result = answer.result
        doc = completion.document(
            output_text(result.outputs),
            finish_reason_of(result.annotations),
            usage_of(result.annotations),
        )
        response = web.json_response(doc)
        _timing_headers(response, answer)
        _id_header(response, request, result.request_id)
        return response

    async def _stream(
        self,
        request: web.Request,
        model: str,
        parse: Callable[[Screen], InferRequest],
        caller: Caller,
        completion: Completion,
        usage: bool,
    ) -> web.StreamResponse:
        """Server-sent events: the pieces as the worker makes them, the last chunk with the
        finish_reason, the usage when asked, `[DONE]`. A refusal before the first piece is
        an ordinary error answer; one after it (the status is sent) an `error` event. The
        caller hanging up cancels the handler, and so the job."""
        pieces: asyncio.Queue[str] = asyncio.Queue()
        cursor = TextCursor()

        def piece(result: JobResult) -> None:
            if text := cursor.piece(result.text_offset, output_text(result.outputs)):
                pieces.put_nowait(text)

        task = asyncio.ensure_future(_generation(self._plane.infer(model, parse, caller, piece)))
        try:
            first = await _next_piece(pieces, task)
            if first is None:
                task.result()  # a refusal: raised here, answered as an ordinary error
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            _id_header(response, request)
            await response.prepare(request)
            try:
                await self._events(response, completion, first, pieces, task, cursor, usage)
            except ConnectionResetError:  # the caller left between two events: its job ends
                pass
            return response
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _events(
        self,
        response: web.StreamResponse,
        completion: Completion,
        first: str | None,
        pieces: asyncio.Queue[str],
        task: asyncio.Future[Answer],
        cursor: TextCursor,
        usage: bool,
    ) -> None:
        """A stream's events from its first piece to `[DONE]`."""
        if completion.chat:  # the role first, as OpenAI's chat streams begin
            await _event(response, completion.chunk(None))
        text = first
        while text is not None:
            await _event(response, completion.chunk(text))
            text = await _next_piece(pieces, task)
        try:
            result = task.result().result
        except MeshError as err:
            await _event(response, sse_error(http_status(err.code), err.message))
        except REDIS_OUTAGE:
            await _event(response, sse_error(503, REDIS_OUTAGE_MESSAGE))
        except Exception:  # the status is sent: the stream ends with the error as an event
            log.exception("unexpected error in a stream")
            await _event(response, sse_error(500, INTERNAL_MESSAGE))
        else:
            if rest := cursor.rest(output_text(result.outputs)):
                await _event(response, completion.chunk(rest))
            await _event(response, completion.chunk(None, finish_reason_of(result.annotations)))
            if usage:
                await _event(response, completion.usage_chunk(usage_of(result.annotations)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()

    async def _body(self, request: web.Request) -> bytes:
        """The body, once the caller's key passed (a stranger's body is never read)."""
        caller = caller_of(request)
        try:
            self._plane.authenticate(caller)
        except MeshError as err:
            self._plane.refused_unread(caller, INFER, "", err)
            raise
        return await self._read_body(request)


async def _generation(call: Awaitable[Answer]) -> Answer:
    """A generation call whose refusals name OpenAI's fields (`max_tokens`, not
    `max_new_tokens`)."""
    try:
        return await call
    except ParamError:
        raise
    except MeshError as err:
        param, message = openai_param(err, err.message)
        if param:
            raise ParamError(param, message) from None
        raise


async def _next_piece(pieces: asyncio.Queue[str], task: asyncio.Future[Answer]) -> str | None:
    """The next piece of a streamed answer, or None once the answer ended (answered or
    refused) and every piece was taken."""
    if not pieces.empty():
        return pieces.get_nowait()
    if task.done():
        return None
    getter = asyncio.ensure_future(pieces.get())
    waited: set[asyncio.Future[Any]] = {getter, task}
    try:
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getter.done():
            getter.cancel()
    if getter.done() and not getter.cancelled():
        return getter.result()
    return pieces.get_nowait() if not pieces.empty() else None


async def _event(response: web.StreamResponse, doc: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n")


def _infer_request(model: str, inputs: Any, headers: Headers, whole_text: bool) -> InferRequest:
    return InferRequest(
        model=model,
        version="",
        inputs=inputs,
        client_request_id=headers.client_request_id,
        priority=headers.priority,
        timeout_us=headers.timeout_us,
        controls=Controls(whole_text=whole_text) if whole_text else NO_CONTROLS,
    )


def _headers(request: web.Request) -> Headers:
    """What the caller's headers ask; INVALID_ARGUMENT for one that is not a number."""
    h = request.headers
    return Headers(
        client_request_id=h.get(REQUEST_ID_HEADER, "")[:MAX_REQUEST_ID],
        priority=_number(h.get(PRIORITY_HEADER), PRIORITY_HEADER) or 0,
        timeout_us=None
        if (ms := _number(h.get(TIMEOUT_HEADER), TIMEOUT_HEADER)) is None
        else ms * 1000,
    )


def _number(value: str | None, header: str) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise param_error(header, f"expected a whole number, got {value[:32]!r}") from None
    if number < 0:
        raise param_error(header, f"{number} is negative")
    return number


def _timing_headers(response: web.StreamResponse, answer: Answer) -> None:
    """The answer's facts (time breakdown, tier, batch size...) as `x-tiermesh-*` headers."""
    facts = response_facts(answer.result, answer.responded_ns, answer.cache_hit)
    for name, value in facts.items():
        header = "x-tiermesh-" + name[len(RESPONSE_PREFIX) :].replace("_", "-")
        if isinstance(value, bool):
            response.headers[header] = "true" if value else "false"
        else:
            response.headers[header] = f"{value:.3f}" if isinstance(value, float) else str(value)


def _id_header(response: web.StreamResponse, request: web.Request, ours: str = "") -> None:
    """The caller's request id, or the mesh's where it sent none."""
    if rid := request.headers.get(REQUEST_ID_HEADER, "")[:MAX_REQUEST_ID] or ours:
        response.headers[REQUEST_ID_HEADER] = rid
