"""Generative serving through the whole mesh (issue 11) with the real SmolLM2-135M-Instruct:
tritonclient's streaming receives tokens as they are produced, eight streams of very
different lengths share the engine (short ones end first), a cancelled stream frees its
slot and KV memory, and bad inputs are refused with INVALID_ARGUMENT."""

from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.documented_parameters import documented, documented_for
from tests.e2e.conftest import UpProcess, service_metric, start_up
from tests.polling import eventually
from tiermesh.bench.calls import is_final, values_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smollm2"
MODELS = Path(__file__).resolve().parents[2] / "models"
LONG_PROMPT = "Write a long story about a lighthouse keeper and a storm."


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    if not (MODELS / MODEL / "1" / "model.onnx").is_file():
        pytest.fail("models/smollm2 is not fetched: run `tiermesh models fetch smollm2`")
    up = start_up(tmp_path_factory.mktemp("gen"), fetched=[MODEL], span_files=False)
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def prompt_input(text: str) -> list[grpcclient.InferInput]:
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [t]


def text_of(result: Any) -> str:
    return str(result.as_numpy("text_output")[0].decode())


def params_of(result: Any) -> dict[str, Any]:
    """The mesh's response parameters (`tiermesh.<name>`), by name."""
    return values_of(result.get_response().parameters)


@dataclass
class Streamed:
    """What one request received on a stream: (arrival, text) of each response, final last."""

    pieces: list[tuple[float, str]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    error: str = ""
    sent: float = 0.0

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.pieces)


class StreamClient:
    """One tritonclient stream; responses sorted by request id as they arrive."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.got: dict[str, Streamed] = {}
        self.done: queue.Queue[str] = queue.Queue()
        self.order: list[str] = []  # request ids in the order their final response came
        self._lock = threading.Lock()
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result: Any, error: Any) -> None:
        now = time.monotonic()
        if error is not None:
            rid = getattr(error, "request_id", "") or "?"
            with self._lock:
                self.got.setdefault(rid, Streamed()).error = str(error)
            self.done.put(rid)
            return
        rid = result.get_response().id
        params = params_of(result)
        with self._lock:
            rec = self.got.setdefault(rid, Streamed())
            rec.pieces.append((now, text_of(result)))
            if is_final(result.get_response().parameters):
                rec.final = params
                self.order.append(rid)
                self.done.put(rid)

    def send(self, rid: str, prompt: str, timeout_us: int | None = None, **parameters: Any) -> None:
        with self._lock:
            self.got.setdefault(rid, Streamed()).sent = time.monotonic()
        self.client.async_stream_infer(
            MODEL, prompt_input(prompt), request_id=rid, parameters=parameters, timeout=timeout_us
        )

    def wait(self, n: int, timeout_s: float = 120) -> None:
        for _ in range(n):
            self.done.get(timeout=timeout_s)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def infer(mesh: UpProcess, prompt: str, **parameters: Any) -> Any:
    client = grpcclient.InferenceServerClient(mesh.url)
    try:
        return client.infer(MODEL, prompt_input(prompt), parameters=parameters)
    finally:
        client.close()


def worker_metric(mesh: UpProcess, name: str, **labels: str) -> float:
    return service_metric(mesh, "worker", name, **labels)


def test_model_config_says_decoupled(mesh: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(mesh.url)
    config = client.get_model_config(MODEL).config
    assert config.model_transaction_policy.decoupled
    assert [i.name for i in config.input] == ["text_input"]


def test_model_infer_returns_the_whole_answer(mesh: UpProcess) -> None:
    result = infer(mesh, "What is the capital of France?", max_new_tokens=16)
    assert text_of(result) == "The capital of France is Paris."
    params = params_of(result)
    assert params["finish_reason"] == "stop"
    assert params["generated_tokens"] == 8  # 7 tokens of text, then <|im_end|>
    assert params["prompt_tokens"] > 20  # the chat template's system prompt is there
    assert params["ttft_ms"] > 0 and params["tpot_ms"] > 0
    # The names the README documents for a generative answer, and no other.
    sent = {f"tiermesh.{k}" for k in params}
    assert documented_for("always", "generative") <= sent <= set(documented())
    assert {"tiermesh.queue_ms", "tiermesh.compute_ms"} <= sent


def test_stream_delivers_tokens_incrementally(mesh: UpProcess) -> None:
    whole = text_of(infer(mesh, LONG_PROMPT, max_new_tokens=40))
    stream = StreamClient(mesh.url)
    try:
        stream.send("story", LONG_PROMPT, max_new_tokens=40)
        stream.wait(1)
    finally:
        stream.close()
    rec = stream.got["story"]
    assert not rec.error and rec.final is not None
    assert rec.final["generated_tokens"] == 40 and rec.final["finish_reason"] == "length"
    # Streamed or not, greedy gives one answer; the pieces add up to it.
    assert rec.text == whole
    texts = [t for _, t in rec.pieces[:-1]]
    assert len(texts) >= 20 and all(texts), "a piece per token or so, none empty"
    first, last = rec.pieces[0][0], rec.pieces[-1][0]
    # The first token comes long before the last: most of the answer streams after it.
    assert first - rec.sent < (last - rec.sent) / 4


def test_eight_streams_short_ones_end_first(mesh: UpProcess) -> None:
    lengths = {f"r{i}": n for i, n in enumerate([4, 96, 6, 64, 8, 48, 12, 32])}
    stream = StreamClient(mesh.url)
    try:
        for rid, n in lengths.items():
            stream.send(rid, LONG_PROMPT, max_new_tokens=n)
        stream.wait(len(lengths))
    finally:
        stream.close()
    got = stream.got
    assert all(not r.error for r in got.values()), {k: r.error for k, r in got.items()}
    for rid, n in lengths.items():
        final = got[rid].final
        assert final is not None and final["generated_tokens"] == n, (rid, final)
    # Continuous batching: answers end in the order of their lengths, the shortest long
    # before the longest (a static batch would hold every answer until the longest ends).
    assert stream.order == sorted(lengths, key=lengths.__getitem__)
    # Counted in the longest answer's own pieces, not in seconds (their ratio depends on how
    # fast this machine prefills against how fast it decodes): by the time the shortest
    # answer ended, the longest had produced under a third of its pieces.
    r0_end = got["r0"].pieces[-1][0]
    longest_pieces = got["r1"].pieces
    assert sum(at <= r0_end for at, _ in longest_pieces) < len(longest_pieces) / 3
    # Every stream got the same greedy answer, as far as it went.
    longest = got["r1"].text
    assert all(longest.startswith(r.text) for r in got.values())


def test_cancelled_stream_frees_its_slot_and_kv_memory(mesh: UpProcess) -> None:
    stream = StreamClient(mesh.url)
    try:
        stream.send("long", LONG_PROMPT, max_new_tokens=400)
        eventually(lambda: len(stream.got["long"].pieces) >= 3, "three pieces")
        # The worker reports its engine's load every 100 ms.
        eventually(
            lambda: (
                worker_metric(mesh, "tiermesh_generation_kv_reserved_tokens") > 400
                and worker_metric(mesh, "tiermesh_generation_sequences") == 1
            ),
            "the running sequence and its KV reservation in the worker's gauges",
        )
    finally:
        stream.close(cancel=True)
    eventually(
        lambda: worker_metric(mesh, "tiermesh_generation_requests_total", reason="cancelled"),
        "the worker to count the cancelled request",
    )
    eventually(
        lambda: (
            worker_metric(mesh, "tiermesh_generation_sequences") == 0
            and worker_metric(mesh, "tiermesh_generation_kv_reserved_tokens") == 0
        ),
        "the slot and its KV reservation to be freed",
    )
    assert stream.got["long"].final is None
    # The mesh goes on serving.
    assert text_of(infer(mesh, "What is the capital of France?", max_new_tokens=16))


def test_seeded_sampling_is_reproducible(mesh: UpProcess) -> None:
    asked = dict(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)
    first = text_of(infer(mesh, LONG_PROMPT, **asked))
    assert text_of(infer(mesh, LONG_PROMPT, **asked)) == first
    stop = first.split()[2]
    cut = text_of(infer(mesh, LONG_PROMPT, **asked, stop=json.dumps([stop])))
    assert cut == first[: first.index(stop)]


def test_the_generate_command_prints_the_answer_as_it_comes(mesh: UpProcess) -> None:
    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tiermesh.cli.main", "generate", "--url", mesh.url, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = command("What is the capital of France?")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "The capital of France is Paris.\n"
    assert "8 tokens" in done.stderr and "finish stop" in done.stderr
    refused = command("hi", "--temperature", "nan")
    assert refused.returncode == 2  # refused by the CLI before it connects
    assert "temperature: nan is not a finite number" in refused.stderr


def test_a_batch_job_for_a_generative_model_is_refused(mesh: UpProcess, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "Say hello."}\n')
    command = ["batch", "submit", MODEL, str(prompts), "--url", mesh.url]
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", *command],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "generates text: batch jobs take models that answer in one pass" in done.stderr


def test_kill_9_the_worker_mid_answer_loses_nothing(new_up: Callable[..., UpProcess]) -> None:
    """The worker dies while it streams an answer; `tiermesh up` restarts it, the new worker
    reclaims the entry and generates the answer again; the caller gets every piece once."""
    up = new_up(
        fetched=[MODEL],
        span_files=False,
        extra_env={"TIERMESH_RECLAIM_MIN_IDLE_MS": "1000", "TIERMESH_RECLAIM_INTERVAL_MS": "200"},
    )
    whole = text_of(infer(up, LONG_PROMPT, max_new_tokens=60))
    stream = StreamClient(up.url)
    try:
        stream.send("story", LONG_PROMPT, timeout_us=90_000_000, max_new_tokens=60)
        eventually(lambda: len(stream.got["story"].pieces) >= 5, "five pieces")
        os.kill(up.children()["worker"], signal.SIGKILL)
        stream.wait(1, timeout_s=90)
    finally:
        stream.close()
    rec = stream.got["story"]
    assert not rec.error and rec.final is not None, rec.error
    assert rec.final["generated_tokens"] == 60
    assert rec.text == whole  # nothing lost, nothing twice
    assert "reclaimed entries of a dead worker" in up.log.read_text()


BAD = [
    ("", {}, "prompt: empty"),
    ("   \n", {}, "prompt: empty"),
    ("hi", {"max_new_tokens": 0}, "max_new_tokens: 0 is outside 1..512"),
    ("hi", {"max_new_tokens": 100_000}, "outside 1..512"),
    ("hi", {"max_new_tokens": "ten"}, "max_new_tokens: expected an integer"),
    ("hi", {"temperature": math.nan}, "temperature: nan is not a finite number"),
    ("hi", {"temperature": math.inf}, "temperature: inf is not a finite number"),
    ("hi", {"temperature": 2.5}, "temperature: 2.5 is outside [0.0, 2.0]"),
    ("hi", {"top_p": 0.0}, "top_p: 0.0 is outside (0.0, 1.0]"),
    ("hi", {"seed": -1}, "seed: -1 is outside"),
    ("hi", {"stop": json.dumps(["ok", ""])}, "stop: each entry must be a non-empty string"),
    ("hi", {"stop": "[not json"}, "a JSON list of strings"),
    ("word " * 2100, {}, "over the model's context length of 2048"),
    ("word " * 1900, {"max_new_tokens": 300}, "exceeds the context length of 2048"),
]


@pytest.mark.parametrize(("prompt", "parameters", "message"), BAD)
def test_bad_input_is_invalid_argument(
    mesh: UpProcess, prompt: str, parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(mesh, prompt, **parameters)
    assert err.value.status() == f"StatusCode.{grpc.StatusCode.INVALID_ARGUMENT.name}"
    assert message in err.value.message()
