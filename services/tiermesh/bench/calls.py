"""The bench's only contact with tritonclient: model inputs, one call, its outcome.

Response parameters are read as the mesh's contract names them (`queue_ms` ... as
doubles, `batch_size` ... as int64, `tier` ... as strings), with or without a `tiermesh.`
prefix; the earlier integer microsecond form (`queue_us`, with `route_us` standing for
the router's input processing) is read too. Anything absent stays absent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tiermesh.bench.records import CLIENT_ERROR, OK, STAGES, Outcome, Reply
from tiermesh.bench.workload import InputSpec, RequestSpec

PREFIX = "tiermesh."
RETRY_AFTER_KEY = "retry-after-ms"
# Microsecond names of the first timing parameters -> the contract's stage names.
_LEGACY_STAGES = {f"{stage}_us": stage for stage in STAGES} | {"route_us": "preprocess"}
_INTS = ("batch_size", "bucket", "tokens", "padded_tokens")
_STRINGS = ("tier", "variant", "worker")
# The client's own deadline sits a little past the one the mesh is given, so the mesh
# gets to answer DEADLINE_EXCEEDED itself when it can.
CLIENT_DEADLINE_SLACK_S = 0.25


class BenchError(Exception):
    """The run cannot start (server unreachable, unknown model, unusable inputs)."""


def _value(param: Any) -> Any:
    which = param.WhichOneof("parameter_choice")
    return getattr(param, which) if which else None


def read_reply(params: Mapping[str, Any]) -> Reply:
    """A Reply from a response's parameter map (KServe InferParameter values)."""
    values = {key.removeprefix(PREFIX): _value(p) for key, p in params.items()}
    stages: dict[str, float] = {}
    for key, value in values.items():
        if value is None or isinstance(value, str | bool):
            continue
        if key.endswith("_ms") and key[:-3] in STAGES:
            stages[key[:-3]] = float(value)
    for key, stage in _LEGACY_STAGES.items():
        value = values.get(key)
        if stage not in stages and isinstance(value, int | float) and not isinstance(value, bool):
            stages[stage] = float(value) / 1000.0
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
    retry_after: float | None = None
    rpc = exc.__context__
    if isinstance(rpc, grpc.aio.AioRpcError):
        for key, value in rpc.trailing_metadata() or ():
            if key == RETRY_AFTER_KEY:
                try:
                    retry_after = float(value)
                except (TypeError, ValueError):
                    pass
    return code, retry_after


async def model_inputs(client: grpcaio.InferenceServerClient, model: str) -> list[InputSpec]:
    """The model's inputs from its metadata; BenchError when the server or model is not
    there."""
    try:
        meta = await client.get_model_metadata(model, as_json=True, client_timeout=10.0)
    except InferenceServerException as exc:
        raise BenchError(f"model {model!r}: {error_of(exc)[0]}: {exc.message()}") from None
    return [
        InputSpec(i["name"], i["datatype"], tuple(int(d) for d in i.get("shape", [])))
        for i in meta.get("inputs", [])
    ]


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
        inputs = []
        for tensor in spec.inputs:
            inp = grpcaio.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)
            inp.set_data_from_numpy(tensor.array)
            inputs.append(inp)
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
