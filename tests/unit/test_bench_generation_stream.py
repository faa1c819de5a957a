"""bench generate against a real grpc.aio server on port 0 that stands in for the mesh: it
answers ModelMetadata / ModelConfig as a generative model does and streams scripted pieces
(ModelStreamInfer) or one whole answer (ModelInfer). The client's clock is injected, so
its TTFT and TPOT are exact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from tests.grpc_server import serving
from tiermesh.bench import markdown, session
from tiermesh.bench.calls import BenchError, GenSender, generative_model
from tiermesh.bench.config import BenchConfig
from tiermesh.bench.genwork import GenerationPlan, GenWorkload
from tiermesh.bench.records import INCOMPLETE, OK, STREAM_ERROR
from tiermesh.core.v2_parameters import set_parameter

FINAL = {"prompt_tokens": 12, "generated_tokens": 4, "ttft_ms": 80.0, "tpot_ms": 20.0}


def response(
    request_id: str, text: str | None, final: bool | None, **params: object
) -> service_pb2.ModelInferResponse:
    resp = service_pb2.ModelInferResponse(model_name="smollm2", id=request_id)
    if text is not None:
        resp.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        raw = serialize_byte_tensor(np.array([text.encode()], dtype=np.object_))
        resp.raw_output_contents.append(raw.item())
    if final is not None:
        resp.parameters["triton_final_response"].bool_param = final
    for key, value in params.items():
        set_parameter(resp.parameters[f"tiermesh.{key}"], value)
    return resp


@dataclass
class Abort:
    code: grpc.StatusCode
    details: str
    trailers: tuple[tuple[str, str], ...] = ()


@dataclass
class End:
    """Ends the call at once, whatever the client still sends."""


Step: TypeAlias = service_pb2.ModelInferResponse | str | Abort | End
Script: TypeAlias = Callable[[service_pb2.ModelInferRequest], list[Step]]


def pieces_script(request: service_pb2.ModelInferRequest) -> list[Step]:
    rid = request.id
    return [
        response(rid, "", False),  # a piece without text: not the first token
        response(rid, "Hel", False),
        response(rid, "lo", False),
        response(rid, " world", False),
        response(rid, "", True, finish_reason="length", queue_ms=1.5, compute_ms=30.0, **FINAL),
    ]


@dataclass
class FakeMesh(service_pb2_grpc.GRPCInferenceServiceServicer):
    script: Script = pieces_script
    decoupled: bool = True
    inputs: tuple[tuple[str, str], ...] = (("text_input", "BYTES"),)
    received: list[service_pb2.ModelInferRequest] = field(default_factory=list)
    half_closed: int = 0

    async def ModelMetadata(
        self, request: service_pb2.ModelMetadataRequest, context: Any
    ) -> service_pb2.ModelMetadataResponse:
        meta = service_pb2.ModelMetadataResponse(name=request.name, platform="tiermesh")
        for name, datatype in self.inputs:
            meta.inputs.add(name=name, datatype=datatype, shape=[1])
        meta.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        return meta

    async def ModelConfig(
        self, request: service_pb2.ModelConfigRequest, context: Any
    ) -> service_pb2.ModelConfigResponse:
        config = model_config_pb2.ModelConfig(name=request.name)
        config.model_transaction_policy.decoupled = self.decoupled
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[service_pb2.ModelInferRequest], context: Any
    ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        async for request in request_iterator:
            self.received.append(request)
            for step in self.script(request):
                if isinstance(step, End):
                    return
                if isinstance(step, Abort):
                    context.set_trailing_metadata(step.trailers)
                    await context.abort(step.code, step.details)
                if isinstance(step, str):
                    yield service_pb2.ModelStreamInferResponse(error_message=step)
                elif isinstance(step, service_pb2.ModelInferResponse):
                    yield service_pb2.ModelStreamInferResponse(infer_response=step)
        self.half_closed += 1  # the client half-closed: the call ends (OK)

    async def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: Any
    ) -> service_pb2.ModelInferResponse:
        self.received.append(request)
        return response(request.id, "Hello world", None, finish_reason="stop", **FINAL)


@pytest.fixture
async def mesh() -> AsyncIterator[tuple[FakeMesh, str]]:
    servicer = FakeMesh()
    add = service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
    async with serving(add, servicer) as address:
        yield servicer, address


class Ticks:
    """A clock that reads the given instants in turn, then stays at the last one."""

    def __init__(self, *instants: float) -> None:
        self._instants: Iterator[float] = iter(instants)
        self.now = 0.0

    def __call__(self) -> float:
        self.now = next(self._instants, self.now)
        return self.now


async def _send(
    url: str, clock: Callable[[], float] | None = None, stream: bool = True, stop: str = ""
) -> Any:
    client = grpcaio.InferenceServerClient(url)
    try:
        target = await generative_model(client, "smollm2")
        plan = GenerationPlan(prompts=("Say hello.",), max_new_tokens=(("4", 1.0),), stop=stop)
        spec = next(GenWorkload(target.prompt, plan, seed=1))
        extra = {"clock": clock} if clock is not None else {}
        sender = GenSender(client, "smollm2", target, 5.0, stream=stream, variant="int8", **extra)
        return await sender(spec)
    finally:
        await client.close()


async def test_streamed_pieces_give_client_and_server_timings(
    mesh: tuple[FakeMesh, str],
) -> None:
    servicer, url = mesh
    # start, then one reading per response: "" 0.10, "Hel" 0.15, "lo" 0.20, " world" 0.30,
    # final 0.35.
    out = await _send(url, Ticks(0.0, 0.10, 0.15, 0.20, 0.30, 0.35), stop='["\\n\\n", "User:"]')
    assert out.code == OK
    gen = out.generation
    assert gen.ttft_ms == pytest.approx(150.0)  # the first piece with text
    assert gen.tpot_ms == pytest.approx((0.30 - 0.15) * 1e3 / 3)  # 4 tokens: 3 gaps
    assert out.latency_ms == pytest.approx(350.0)
    assert (gen.pieces, gen.text_chars, gen.max_new_tokens) == (5, len("Hello world"), 4)
    assert (gen.generated_tokens, gen.prompt_tokens) == (4, 12)
    assert (gen.server_ttft_ms, gen.server_tpot_ms, gen.finish_reason) == (80.0, 20.0, "length")
    assert out.reply.stages_ms == {"queue": 1.5, "compute": 30.0}
    # What the mesh was asked, as the contract names it.
    (request,) = servicer.received
    assert request.id == "bench-0" and request.model_name == "smollm2"
    params = {
        k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in request.parameters.items()
    }
    assert params["max_new_tokens"] == 4 and params["temperature"] == 0.0
    assert params["top_p"] == 1.0 and isinstance(params["seed"], int)
    assert json.loads(params["stop"]) == ["\n\n", "User:"] and params["variant"] == "int8"
    assert params["timeout"] == 5_000_000
    prompt = deserialize_bytes_tensor(request.raw_input_contents[0])
    assert request.inputs[0].name == "text_input" and list(prompt) == [b"Say hello."]
    assert servicer.half_closed == 1  # the stream closed cleanly after the final response


async def test_real_clock_and_a_final_without_the_flag(mesh: tuple[FakeMesh, str]) -> None:
    """Responses of another request id are not ours; without `triton_final_response` the
    response carrying `finish_reason` is the last one."""
    servicer, url = mesh
    servicer.script = lambda request: [
        response("someone-else", "ignored", True, finish_reason="stop"),
        response(request.id, "Hi", None),
        response(request.id, "!", None, finish_reason="stop", **FINAL),
    ]
    out = await _send(url)
    assert out.code == OK and out.generation.finish_reason == "stop"
    assert out.generation.pieces == 2 and out.generation.text_chars == 3
    assert 0 < out.generation.ttft_ms <= out.latency_ms
    assert out.generation.tpot_ms is not None and out.generation.tpot_ms >= 0


async def test_in_band_error_is_a_stream_error(mesh: tuple[FakeMesh, str]) -> None:
    servicer, url = mesh
    servicer.script = lambda request: ["max_new_tokens: 4096 is outside 1..512"]
    out = await _send(url, Ticks(0.0, 0.05, 0.06))
    assert out.code == STREAM_ERROR and out.reply is None
    assert out.generation.error == "max_new_tokens: 4096 is outside 1..512"
    assert out.generation.ttft_ms is None and out.latency_ms == pytest.approx(60.0)
    assert servicer.half_closed == 1


async def test_aborted_stream_keeps_code_and_retry_after(mesh: tuple[FakeMesh, str]) -> None:
    servicer, url = mesh
    servicer.script = lambda request: [
        response(request.id, "Hel", False),
        Abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", (("retry-after-ms", "250"),)),
    ]
    out = await _send(url, Ticks(0.0, 0.1, 0.2))
    assert (out.code, out.retry_after_ms) == ("RESOURCE_EXHAUSTED", 250.0)
    assert out.generation.error == "queue full"
    assert out.generation.ttft_ms == pytest.approx(100.0)  # it did get a first token


async def test_stream_that_ends_before_the_final_response(mesh: tuple[FakeMesh, str]) -> None:
    servicer, url = mesh
    servicer.script = lambda request: [response(request.id, "Hel", False), End()]
    out = await _send(url)
    assert out.code == INCOMPLETE and out.generation.pieces == 1
    assert "before the final response" in out.generation.error


async def test_unstreamed_generation_is_one_response(mesh: tuple[FakeMesh, str]) -> None:
    servicer, url = mesh
    out = await _send(url, Ticks(0.0, 0.4), stream=False)
    assert out.code == OK and out.latency_ms == pytest.approx(400.0)
    gen = out.generation
    assert gen.ttft_ms == pytest.approx(400.0) and gen.tpot_ms is None
    assert (gen.generated_tokens, gen.server_tpot_ms, gen.finish_reason) == (4, 20.0, "stop")
    assert servicer.received[0].parameters["max_new_tokens"].int64_param == 4


async def test_generative_models_are_recognised(mesh: tuple[FakeMesh, str]) -> None:
    servicer, url = mesh
    client = grpcaio.InferenceServerClient(url)
    try:
        target = await generative_model(client, "smollm2")
        assert (target.prompt.name, target.output, target.decoupled) == (
            "text_input",
            "text_output",
            True,
        )
        servicer.inputs = (("prompt", "BYTES"),)  # decoupled, another input name
        assert (await generative_model(client, "smollm2")).prompt.name == "prompt"
        servicer.decoupled = False
        with pytest.raises(BenchError, match="not a generative model"):
            await generative_model(client, "minilm")
        servicer.inputs = (("INPUT0", "FP32"),)
        with pytest.raises(BenchError, match="no BYTES 'text_input' input"):
            await generative_model(client, "mlp")
    finally:
        await client.close()


async def test_generate_run_writes_its_report(mesh: tuple[FakeMesh, str], tmp_path: Path) -> None:
    servicer, url = mesh
    cfg = BenchConfig(
        scenario="generate",
        out_dir=tmp_path / "gen",
        url=url,
        model="smollm2",
        requests=6,
        concurrency=2,
        warmup=1,
        progress=False,
        generation=GenerationPlan(max_new_tokens=(("4", 0.5), ("8-16", 0.5))),
    )
    written = session.write(await session.measure(cfg), cfg.out_dir)
    g = written.report["generation"]
    assert g["answered"] == 6 and g["ttft_ms"]["n"] == 6 and g["tpot_ms"]["n"] == 6
    assert g["generated_tokens"]["total"] == 24 and g["finish_reasons"] == {"length": 6}
    assert [r["max_new_tokens"] for r in g["by_max_new_tokens"]] == ["4", "8-16"]
    assert written.report["concurrency"] == 2
    # The warm-up's requests ask for short answers.
    assert servicer.received[0].parameters["max_new_tokens"].int64_param <= 8
    assert len(servicer.received) == 7
    summary = (cfg.out_dir / "summary.md").read_text()
    assert "## Generation" in summary and "| TTFT (client) | 6 |" in summary
    assert "tokens/s" in markdown.console_generation(written.report)
    assert (cfg.out_dir / "ttft_distribution.png").stat().st_size > 0
    assert "tpot_distribution.png" in written.report["plots"]
