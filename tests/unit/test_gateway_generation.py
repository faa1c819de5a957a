"""The gateway's side of generative serving: parameters from tritonclient's request, the
checked GenerationRequest, the text a streaming caller has not seen, pieces through the pending
requests, and the config section of a generative model."""

from __future__ import annotations

import asyncio
import copy
import math
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from tritonclient.grpc._utils import _get_inference_request

from tiermesh.core.errors import MeshError
from tiermesh.core.jobs import GenerationRequest, Job, JobResult
from tiermesh.core.model_config import GenerationSpec
from tiermesh.core.repository import RepositoryError, parse_config
from tiermesh.core.wire import decode_job, encode_job, result_from_proto, result_to_proto
from tiermesh.gateway.converters import (
    FINAL_RESPONSE,
    infer_request,
    infer_response,
    model_config,
    piece_response,
)
from tiermesh.gateway.generation import TextCursor, derived_seed, generation_of
from tiermesh.gateway.pending import PendingRequests
from tiermesh.generate.tensors import output_text, prompt_of, text_tensor

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = yaml.safe_load((ROOT / "models" / "smollm2" / "config.yaml").read_text())
SPEC = GenerationSpec(max_new_tokens=100, max_prompt_bytes=64)


def request(prompt: str, **parameters: Any) -> Any:
    t = triton.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
    msg = _get_inference_request(
        "smollm2", [t], "", "r1", None, False, 0, 0, 0, 0, parameters or None
    )
    return infer_request(msg)


def test_parameters_come_through_as_tritonclient_sends_them() -> None:
    req = request("hi", max_new_tokens=5, temperature=0.5, top_p=0.9, seed=3, stop='["\\n", "end"]')
    assert req.parameters == {
        "max_new_tokens": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n", "end"],
    }
    assert request("hi", stop="User:").parameters == {"stop": "User:"}
    assert request("hi", variant="fp32").parameters == {}  # not a generation parameter


def test_a_stop_list_that_is_not_json_is_refused() -> None:
    with pytest.raises(MeshError, match="JSON list of strings"):
        request("hi", stop="[broken")


def test_generation_of_checks_and_fills_in() -> None:
    req = request("Tell me.", max_new_tokens=7, temperature=0.8)
    gen = generation_of(SPEC, req.inputs, dict(req.parameters), "rid", stream=True)
    assert gen == GenerationRequest(7, 0.8, 1.0, derived_seed("rid"), (), True)
    assert derived_seed("rid") != derived_seed("other")
    seeded = request("Tell me.", seed=0)
    assert generation_of(SPEC, seeded.inputs, dict(seeded.parameters), "rid", False).seed == 0
    plain = request("Tell me.")
    gen = generation_of(SPEC, plain.inputs, dict(plain.parameters), "rid", False)
    assert gen.max_new_tokens == 64 and gen.temperature == 0 and not gen.stream


@pytest.mark.parametrize(
    ("prompt", "parameters", "message"),
    [
        ("", {}, "prompt: empty"),
        ("x" * 65, {}, "prompt: 65 bytes, over the limit of 64"),
        ("hi", {"max_new_tokens": 101}, "max_new_tokens: 101 is outside 1..100"),
        ("hi", {"max_new_tokens": 0}, "max_new_tokens: 0 is outside 1..100"),
        ("hi", {"temperature": math.nan}, "temperature: nan is not a finite number"),
        ("hi", {"top_p": 1.5}, "top_p: 1.5 is outside (0.0, 1.0]"),
        ("hi", {"seed": -2}, "seed: -2 is outside"),
        ("hi", {"stop": '["a", 3]'}, "stop: each entry must be a non-empty string"),
    ],
)
def test_bad_generation_inputs_are_invalid_argument(
    prompt: str, parameters: dict[str, Any], message: str
) -> None:
    req = request(prompt, **parameters)
    with pytest.raises(MeshError) as err:
        generation_of(SPEC, req.inputs, dict(req.parameters), "rid", False)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.message


def test_text_cursor_skips_repeats_and_gaps() -> None:
    cursor = TextCursor()
    assert cursor.piece(0, "Hel") == "Hel"
    assert cursor.piece(0, "Hel") == ""  # the same piece again (a redelivered request)
    assert cursor.piece(1, "ello") == "lo"  # overlapping: only what is new
    assert cursor.piece(9, "far") == ""  # past a gap: left to the final answer
    assert cursor.piece(5, " wor") == " wor"
    assert cursor.rest("Hello world!") == "ld!"
    assert cursor.rest("Hello world!") == ""


def test_pieces_reach_the_streaming_caller_then_the_answer() -> None:
    async def scenario() -> tuple[list[str], JobResult, int]:
        pending = PendingRequests()
        seen: list[str] = []
        fut = pending.register("a", lambda r: seen.append(output_text(r.outputs)))
        plain = pending.register("b")

        def piece(rid: str, text: str) -> JobResult:
            return JobResult(rid, "m", "gw", outputs=(text_tensor(text),), partial=True)

        assert pending.resolve(piece("a", "He"))
        assert pending.resolve(piece("a", "llo"))
        assert not pending.resolve(piece("b", "x"))  # b does not stream: late
        assert pending.resolve(JobResult("a", "m", "gw", outputs=(text_tensor("Hello"),)))
        assert not pending.resolve(piece("a", "!"))  # after the answer: late
        pending.discard("b")
        assert plain.cancelled()
        return seen, await fut, pending.late

    seen, final, late = asyncio.run(scenario())
    assert seen == ["He", "llo"] and output_text(final.outputs) == "Hello" and late == 2


def test_generation_and_pieces_survive_the_wire() -> None:
    gen = GenerationRequest(9, 0.7, 0.9, 2**63 - 1, ("\n\n", "User:"), True)
    job = Job("r", "smollm2", (text_tensor("hi"),), "gw:1", generation=gen)
    assert decode_job(encode_job(job)).generation == gen
    assert decode_job(encode_job(Job("r", "mlp", (), "gw"))).generation is None
    piece = JobResult("r", "m", "gw", outputs=(text_tensor("é!"),), partial=True, text_offset=12)
    back = result_from_proto(result_to_proto(piece))
    assert back.partial and back.text_offset == 12 and output_text(back.outputs) == "é!"


def test_piece_and_final_responses() -> None:
    piece = piece_response(JobResult("r", "m", "gw", client_request_id="c7"), text_tensor("ab"))
    assert piece.id == "c7" and not piece.parameters[FINAL_RESPONSE].bool_param
    assert piece.raw_output_contents[0] == text_tensor("ab").raw
    final = JobResult(
        "r",
        "m",
        "gw",
        outputs=(text_tensor("abc"),),
        annotations={
            "prompt_tokens": "31",
            "generated_tokens": "3",
            "ttft_ms": "12.5",
            "tpot_ms": "20.25",
            "finish_reason": "stop",
        },
    )
    params = infer_response(final, 0).parameters
    assert params["tiermesh.prompt_tokens"].int64_param == 31
    assert params["tiermesh.generated_tokens"].int64_param == 3
    assert params["tiermesh.ttft_ms"].double_param == 12.5
    assert params["tiermesh.tpot_ms"].double_param == 20.25
    assert params["tiermesh.finish_reason"].string_param == "stop"


def test_prompt_of_reads_the_text_input() -> None:
    req = request("Grüße 👋")
    assert prompt_of(req.inputs) == "Grüße 👋"


def _generative(**over: Any) -> dict[str, Any]:
    raw = copy.deepcopy(SMOLLM2)
    raw["generation"] = {**raw["generation"], **over}
    return raw


def test_the_smollm2_config_is_generative_and_decoupled() -> None:
    cfg = parse_config(SMOLLM2, "smollm2")
    assert cfg.generation is not None
    assert cfg.generation.context_length == 2048 and cfg.generation.max_new_tokens == 512
    assert model_config(cfg).config.model_transaction_policy.decoupled


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_generative(max_sequences=0), "max_sequences must be >= 1"),
        (_generative(max_new_tokens=2048), "max_new_tokens must be < context_length"),
        (_generative(max_kv_tokens=1000), "max_kv_tokens must be >= context_length"),
        (_generative(step_tokens=4), "step_tokens must be >= max_sequences"),
        (_generative(temperature=1), "unknown key 'temperature'"),
        ({**_generative(), "length_buckets": [16]}, "a generative model has no tiers"),
        (
            {**_generative(), "inputs": [{"name": "x", "datatype": "BYTES", "dims": [1]}]},
            "takes text_input (BYTES)",
        ),
    ],
)
def test_bad_generation_configs_are_refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(RepositoryError) as err:
        parse_config(raw, "smollm2")
    assert message in str(err.value)
