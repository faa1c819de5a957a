"""`tiermesh generate`: one prompt to a generative model through tritonclient, the answer
printed as it is produced (ModelStreamInfer), then its figures (tokens, time to first
token, time per output token, why it ended) on stderr. Ctrl-C cancels the request."""

from __future__ import annotations

import json
import queue
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tiermesh.bench.calls import is_final, values_of
from tiermesh.cli.errors import CliError
from tiermesh.cli.infer import Endpoint

REQUEST_ID = "tiermesh-generate"
# How long the stream's failure may take to reach the callback after the send failed.
STREAM_ERROR_WAIT_S = 2.0
# Longest wait for the next piece of the answer.
PIECE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Ask:
    prompt: str
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def parameters(self) -> dict[str, Any]:
        given: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": json.dumps(list(self.stop)) if self.stop else None,
        }
        return {k: v for k, v in given.items() if v is not None}


def _inputs(prompt: str) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode("utf-8")], dtype=np.object_))
    return [t]


def _params(result: Any) -> dict[str, Any]:
    return values_of(result.get_response().parameters)


def _text(result: Any) -> str:
    value = result.as_numpy("text_output")
    return "" if value is None else bytes(value.reshape(-1)[0]).decode("utf-8", "replace")


def generate(
    endpoint: Endpoint,
    model: str,
    ask: Ask,
    stream: bool = True,
    out: TextIO = sys.stdout,
    timeout_s: float = PIECE_TIMEOUT_S,
) -> dict[str, Any]:
    """Print the answer to `out` (piece by piece when streaming); return the final
    response's parameters plus the client's own time to first piece. Raises
    InferenceServerException for a refusal (its status and message)."""
    client = endpoint.client()
    started = time.perf_counter()
    try:
        if not stream:
            result = client.infer(
                model, _inputs(ask.prompt), parameters=ask.parameters(), headers=endpoint.headers
            )
            out.write(_text(result))
            return {**_params(result), "client_total_ms": (time.perf_counter() - started) * 1e3}
        got: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(
            callback=lambda result, error: got.put((result, error)), headers=endpoint.headers
        )
        cancelled = True
        first_ms: float | None = None
        try:
            _send(client, got, model, ask)
            while True:
                result, error = got.get(timeout=timeout_s)
                if error is not None:
                    raise error
                piece = _text(result)
                if piece and first_ms is None:
                    first_ms = (time.perf_counter() - started) * 1e3
                out.write(piece)
                out.flush()
                if is_final(result.get_response().parameters):
                    params = _params(result)
                    cancelled = False
                    total_ms = (time.perf_counter() - started) * 1e3
                    return {**params, "client_ttft_ms": first_ms, "client_total_ms": total_ms}
        finally:
            # Leaving early (Ctrl-C, a timeout): the mesh stops generating the answer.
            client.stop_stream(cancel_requests=cancelled)
            if cancelled and first_ms is not None:
                out.write("\n")  # the error's line after the partial answer, not on it
    finally:
        client.close()


def _send(client: Any, got: queue.Queue[tuple[Any, Any]], model: str, ask: Ask) -> None:
    """The request on the stream. tritonclient reports a stream that failed (nothing
    listens, TLS refused) through the callback and raises a message without a status
    instead: the callback's error is the one that says what happened."""
    try:
        client.async_stream_infer(
            model, _inputs(ask.prompt), request_id=REQUEST_ID, parameters=ask.parameters()
        )
    except InferenceServerException as failed:
        try:
            _, error = got.get(timeout=STREAM_ERROR_WAIT_S)
        except queue.Empty:
            raise failed from None
        raise (error or failed) from None


def figures(params: dict[str, Any]) -> str:
    """One line for stderr: what the answer cost."""
    parts = [
        f"{params.get('generated_tokens', '?')} tokens",
        f"prompt {params.get('prompt_tokens', '?')}",
        f"finish {params.get('finish_reason', '?')}",
    ]
    for key, name in (
        ("client_ttft_ms", "first piece"),
        ("ttft_ms", "server TTFT"),
        ("tpot_ms", "TPOT"),
        ("client_total_ms", "total"),
    ):
        if isinstance(params.get(key), int | float):
            parts.append(f"{name} {params[key]:.1f} ms")
    return ", ".join(parts)


def run(endpoint: Endpoint, model: str, ask: Ask, stream: bool) -> int:
    """The answer on stdout, its figures on stderr; a refusal or a failure raises (the
    CLI's error line: a refusal on a stream comes as a message without a status code)."""
    try:
        params = generate(endpoint, model, ask, stream)
    except queue.Empty:
        raise CliError(
            f"no piece of the answer within {PIECE_TIMEOUT_S:g} s", "is the mesh stuck?"
        ) from None
    print(file=sys.stdout, flush=True)
    print(figures(params), file=sys.stderr)
    return 0
