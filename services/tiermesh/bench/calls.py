"""The bench's only contact with tritonclient: model inputs, one call, its outcome.

Response parameters are read as the mesh's contract names them: `tiermesh.queue_ms` ... as
doubles, `tiermesh.batch_size` ... as int64, `tiermesh.tier` ... as strings (the README's
"Response parameters"). Anything absent stays absent.

Generation (`GenSender`) streams by default: one ModelStreamInfer call per request, whose
responses are pieces of the answer (`text_output`: the text since the previous piece)
until the one with `triton_final_response` true, which carries the request's counts and
server timings. The client half-closes the stream once that final response is in and the
server is expected to end the call; one that does not within `STREAM_CLOSE_GRACE_S` is
cancelled (the request's figures were taken at the final response either way).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tiermesh.bench.genstats import Pieces, generation_of
from tiermesh.bench.records import (
    CLIENT_ERROR,
    INCOMPLETE,
    OK,
    STAGES,
    STREAM_ERROR,
    Outcome,
    Reply,
)
from tiermesh.bench.workload import InputSpec, RequestSpec

PREFIX = "tiermesh."
RETRY_AFTER_KEY = "retry-after-ms"
_INTS = ("batch_size", "bucket", "tokens", "padded_tokens")
_STRINGS = ("tier", "variant", "worker")
# The client's own deadline sits a little past the one the mesh is given, so the mesh
# gets to answer DEADLINE_EXCEEDED itself when it can.
CLIENT_DEADLINE_SLACK_S = 0.25
# A generative model's tensors and the flag of a request's last streamed response.
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
FINAL_RESPONSE = "triton_final_response"
STREAM_CLOSE_GRACE_S = 1.0


class BenchError(Exception):
    """The run cannot start (server unreachable, unknown model, unusable inputs)."""


def _value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def values_of(params: Mapping[str, Any]) -> dict[str, Any]:
    """The mesh's facts in a response's parameter map (`tiermesh.<name>`), as plain values
    by name; the caller's and Triton's own parameters are left out."""
    return {
        key.removeprefix(PREFIX): _value(p) for key, p in params.items() if key.startswith(PREFIX)
    }


def read_reply(params: Mapping[str, Any]) -> Reply:
    """A Reply from a response's parameter map (KServe InferParameter values)."""
    return reply_of(values_of(params))


def reply_of(values: Mapping[str, Any]) -> Reply:
    """A Reply from the mesh's facts as plain values by name (`values_of`)."""
    stages: dict[str, float] = {}
    for key, value in values.items():
        if value is None or isinstance(value, str | bool):
            continue
        if key.endswith("_ms") and key[:-3] in STAGES:
            stages[key[:-3]] = float(value)
    ints = {k: int(v) for k in _INTS if isinstance(v := values.get(k), int | float)}
    strings = {k: v for k in _STRINGS if isinstance(v := values.get(k), str)}
    total = values.get("total_ms")
    return Reply(
        stages_ms=stages,
        total_ms=float(total) if isinstance(total, int | float) else None,
        batch_size=ints.get("batch_size"),
        bucket=ints.get("bucket"),
        tokens=ints.get("tokens"),
        padded_tokens=ints.get("padded_tokens"),
        tier=strings.get("tier", ""),
        variant=strings.get("variant", ""),
        worker=strings.get("worker", ""),
    )


def error_of(exc: BaseException) -> tuple[str, float | None]:
    """The gRPC status code name of a failed call and its `retry-after-ms` trailer."""
    if not isinstance(exc, InferenceServerException):
        return CLIENT_ERROR, None
    code = str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")
    # tritonclient raises from the AioRpcError with `from None`: the trailers stay
    # reachable on the suppressed context.
    rpc = exc.__context__
    return code, _retry_after(rpc) if isinstance(rpc, grpc.aio.AioRpcError) else None


def _retry_after(rpc: grpc.aio.AioRpcError) -> float | None:
    for key, value in rpc.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None


def stream_error_of(exc: BaseException) -> tuple[str, float | None, str]:
    """As `error_of`, for a failure while reading a stream too (tritonclient lets its
    AioRpcError through unwrapped), with the failure's message."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code().name, _retry_after(exc), exc.details() or ""
    code, retry_after = error_of(exc)
    message = exc.message() if isinstance(exc, InferenceServerException) else repr(exc)
    return code, retry_after, str(message or "")


async def _metadata(client: grpcaio.InferenceServerClient, model: str) -> dict[str, Any]:
    """The model's metadata (JSON); BenchError when the server or model is not there."""
    try:
        meta: dict[str, Any] = await client.get_model_metadata(
            model, as_json=True, client_timeout=10.0
        )
    except InferenceServerException as exc:
        raise BenchError(f"model {model!r}: {error_of(exc)[0]}: {exc.message()}") from None
    return meta


def _inputs(meta: Mapping[str, Any]) -> list[InputSpec]:
    return [
        InputSpec(i["name"], i["datatype"], tuple(int(d) for d in i.get("shape", [])))
        for i in meta.get("inputs", [])
    ]


async def model_inputs(client: grpcaio.InferenceServerClient, model: str) -> list[InputSpec]:
    """The model's inputs from its metadata; BenchError when the server or model is not
    there."""
    return _inputs(await _metadata(client, model))


def infer_inputs(spec: RequestSpec) -> list[grpcaio.InferInput]:
    inputs = []
    for tensor in spec.inputs:
        inp = grpcaio.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)
        inp.set_data_from_numpy(tensor.array)
        inputs.append(inp)
    return inputs


class Sender:
    """Sends one RequestSpec and returns its Outcome; never raises for a failed call."""

    def __init__(
        self,
        client: grpcaio.InferenceServerClient,
        model: str,
        timeout_s: float,
        variant: str = "",
    ) -> None:
        self._client = client
        self._model = model
        self._timeout_us = int(timeout_s * 1e6)
        self._client_timeout_s = timeout_s + CLIENT_DEADLINE_SLACK_S
        self._parameters = {"variant": variant} if variant else None

    async def __call__(self, spec: RequestSpec) -> Outcome:
        inputs = infer_inputs(spec)
        start = time.perf_counter()
        try:
            result = await self._client.infer(
                self._model,
                inputs,
                priority=spec.priority,
                timeout=self._timeout_us,
                client_timeout=self._client_timeout_s,
                parameters=self._parameters,
            )
        except Exception as exc:  # every failure is a figure, not a crash
            code, retry_after = error_of(exc)
            return Outcome(code, (time.perf_counter() - start) * 1e3, None, retry_after)
        latency_ms = (time.perf_counter() - start) * 1e3
        return Outcome(OK, latency_ms, read_reply(result.get_response().parameters))


@dataclass(frozen=True)
class GenerativeModel:
    """A generative model's prompt input, its text output and whether its ModelConfig says
    decoupled (None: the config could not be read)."""

    prompt: InputSpec
    output: str
    decoupled: bool | None


async def generative_model(client: grpcaio.InferenceServerClient, model: str) -> GenerativeModel:
    """The model's prompt input and text output; BenchError when the server or model is not
    there or the model is not generative: neither a BYTES `text_input` input nor decoupled
    (ModelConfig `model_transaction_policy.decoupled`) with a single BYTES input."""
    meta = await _metadata(client, model)
    decoupled: bool | None
    try:
        config = await client.get_model_config(model, as_json=True, client_timeout=10.0)
        policy = config.get("config", {}).get("model_transaction_policy", {})
        decoupled = bool(policy.get("decoupled", False))
    except InferenceServerException:
        decoupled = None
    texts = [i for i in _inputs(meta) if i.datatype == "BYTES"]
    prompt = next((i for i in texts if i.name == TEXT_INPUT), None)
    if prompt is None and decoupled and len(texts) == 1:
        prompt = texts[0]
    if prompt is None:
        raise BenchError(
            f"model {model!r} is not a generative model: no BYTES {TEXT_INPUT!r} input"
            + ("" if decoupled else " and its ModelConfig does not say decoupled")
        )
    outputs = [o for o in meta.get("outputs", []) if o.get("datatype") == "BYTES"]
    names = [o["name"] for o in outputs]
    output = names[0] if len(names) == 1 and TEXT_OUTPUT not in names else TEXT_OUTPUT
    return GenerativeModel(prompt, output, decoupled)


def _text(result: grpcaio.InferResult, output: str) -> str:
    array = result.as_numpy(output)
    if array is None:
        return ""
    return "".join(
        x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in array.flat
    )


def is_final(params: Mapping[str, Any]) -> bool:
    """The request's last response: `triton_final_response` true; without the flag, the
    response carrying `tiermesh.finish_reason` (only the last one does)."""
    flag = _value(params[FINAL_RESPONSE]) if FINAL_RESPONSE in params else None
    if isinstance(flag, bool):
        return flag
    return f"{PREFIX}finish_reason" in params


class GenSender:
    """Sends one generation request, streamed (ModelStreamInfer) or not (ModelInfer), and
    returns its Outcome with a Generation; never raises for a failed call. `clock` (s)
    times the request and its pieces."""

    def __init__(
        self,
        client: grpcaio.InferenceServerClient,
        model: str,
        target: GenerativeModel,
        timeout_s: float,
        *,
        stream: bool = True,
        variant: str = "",
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._client = client
        self._model = model
        self._output = target.output
        self._stream = stream
        self._timeout_us = int(timeout_s * 1e6)
        self._client_timeout_s = timeout_s + CLIENT_DEADLINE_SLACK_S
        self._variant = variant
        self._clock = clock

    def _parameters(self, spec: RequestSpec) -> dict[str, Any]:
        extra = {"variant": self._variant} if self._variant else {}
        return {**spec.parameters, **extra}

    async def __call__(self, spec: RequestSpec) -> Outcome:
        if self._stream:
            return await self._streamed(spec)
        return await self._unary(spec)

    async def _unary(self, spec: RequestSpec) -> Outcome:
        asked = int(spec.parameters.get("max_new_tokens", 0))
        start = self._clock()
        pieces = Pieces(start)
        try:
            result = await self._client.infer(
                self._model,
                infer_inputs(spec),
                request_id=f"bench-{spec.index}",
                priority=spec.priority,
                timeout=self._timeout_us,
                client_timeout=self._client_timeout_s,
                parameters=self._parameters(spec),
            )
        except Exception as exc:  # every failure is a figure, not a crash
            code, retry_after, message = stream_error_of(exc)
            latency_ms = (self._clock() - start) * 1e3
            return Outcome(
                code, latency_ms, None, retry_after, generation_of(asked, pieces, None, message)
            )
        end = self._clock()
        pieces.add(end, _text(result, self._output))
        params = result.get_response().parameters
        generation = generation_of(asked, pieces, values_of(params), streamed=False)
        return Outcome(OK, (end - start) * 1e3, read_reply(params), None, generation)

    async def _streamed(self, spec: RequestSpec) -> Outcome:
        asked = int(spec.parameters.get("max_new_tokens", 0))
        request_id = f"bench-{spec.index}"
        answered = asyncio.Event()
        request = {
            "model_name": self._model,
            "inputs": infer_inputs(spec),
            "request_id": request_id,
            "priority": spec.priority,
            "timeout": self._timeout_us,
            "parameters": self._parameters(spec),
        }

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield request
            await answered.wait()  # then the stream half-closes

        start = self._clock()
        pieces = Pieces(start)
        code, retry_after, message = INCOMPLETE, None, "the stream ended before the final response"
        final: dict[str, Any] | None = None
        reply: Reply | None = None
        try:
            stream = self._client.stream_infer(requests(), stream_timeout=self._client_timeout_s)
        except Exception as exc:  # the call could not even start
            code, retry_after, message = stream_error_of(exc)
            generation = generation_of(asked, pieces, None, message)
            return Outcome(code, (self._clock() - start) * 1e3, None, retry_after, generation)
        try:
            async for result, failure in stream:
                at = self._clock()
                if failure is not None:
                    code, message = STREAM_ERROR, str(failure.message() or "")
                    break
                response = result.get_response()
                if response.id and response.id != request_id:
                    continue  # not ours (a server that shares streams): ignored
                pieces.add(at, _text(result, self._output))
                if is_final(response.parameters):
                    code, message, final = OK, "", values_of(response.parameters)
                    reply = read_reply(response.parameters)
                    break
        except Exception as exc:  # every failure is a figure, not a crash
            code, retry_after, message = stream_error_of(exc)
        except BaseException:
            stream.cancel()
            raise
        end = pieces.last_s if code == OK else self._clock()
        answered.set()
        await _close(stream)
        generation = generation_of(asked, pieces, final, message)
        return Outcome(code, (end - start) * 1e3, reply, retry_after, generation)


async def _close(stream: Any) -> None:
    """After the request half-closed: let the server end the call (bounded), then cancel
    whatever is left of it (nothing, when the server ended it)."""
    try:
        async with asyncio.timeout(STREAM_CLOSE_GRACE_S):
            async for _ in stream:
                pass  # nothing is expected after the final response
    except Exception:  # a late failure or the grace running out: the figures are taken
        pass
    finally:
        stream.cancel()
