"""The OpenAI door's pure rules: request bodies (types refused naming the field, unknown
fields ignored, what tiermesh does not do refused), a list input as jobs grouped by length
bucket and answered in the caller's order, `dimensions`, the generation request of a chat or
completion body, and OpenAI's error shape."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
import yaml

from tiermesh.core.model_config import ModelConfig, parse_config
from tiermesh.core.repository import RepositoryError
from tiermesh.core.tensors import to_numpy
from tiermesh.gateway.openai_chat import Completion, Headers, chat_request, completion_request
from tiermesh.gateway.openai_chat import openai_param as v2_field
from tiermesh.gateway.openai_embeddings import document, rows, vectors
from tiermesh.gateway.openai_errors import error_document
from tiermesh.gateway.openai_schema import (
    ChatBody,
    CompletionBody,
    EmbeddingsBody,
    ParamError,
    parsed,
)

MODELS = Path(__file__).resolve().parents[2] / "models"


def minilm(**pool: object) -> ModelConfig:
    raw = yaml.safe_load((MODELS / "minilm-l6" / "config.yaml").read_text())
    raw["pool"].update(pool)
    return parse_config(raw, "minilm-l6")


def refusal(kind: type, body: str) -> ParamError:
    with pytest.raises(ParamError) as err:
        parsed(kind, body.encode())
    return err.value


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        (EmbeddingsBody, '{"model": "m", "input": 5}', "input"),
        (EmbeddingsBody, '{"model": 3, "input": "x"}', "model"),
        (EmbeddingsBody, '{"model": "m", "input": [1, "a"]}', "input"),
        (
            EmbeddingsBody,
            '{"model": "m", "input": "x", "encoding_format": "hex"}',
            "encoding_format",
        ),
        (EmbeddingsBody, '{"model": "m", "input": "x", "dimensions": 0}', "dimensions"),
        (EmbeddingsBody, '{"input": "x"}', "model"),
        (ChatBody, '{"model": "m", "messages": []}', "messages"),
        (
            ChatBody,
            '{"model": "m", "messages": [{"role": "bot", "content": "x"}]}',
            "messages[0].role",
        ),
        (
            ChatBody,
            '{"model": "m", "messages": [{"role": "user", "content": 1}]}',
            "messages[0].content",
        ),
        (
            ChatBody,
            '{"model": "m", "messages": [{"role": "user"}], "temperature": "hot"}',
            "temperature",
        ),
        (
            ChatBody,
            '{"model": "m", "messages": [{"role": "user"}], "max_tokens": "5"}',
            "max_tokens",
        ),
        (ChatBody, '{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (CompletionBody, '{"model": "m", "prompt": 7}', "prompt"),
        (CompletionBody, '{"model": "m", "prompt": "x", "stop": 3}', "stop"),
    ],
)
def test_wrong_types_are_refused_naming_the_field(kind: type, body: str, param: str) -> None:
    err = refusal(kind, body)
    assert err.param == param and err.message.startswith(f"{param}: ")


def test_bodies_that_are_not_objects_or_json() -> None:
    assert "not valid JSON" in refusal(EmbeddingsBody, "{").message
    assert "JSON object" in refusal(EmbeddingsBody, "[1]").message


def test_unknown_fields_are_ignored_as_openai_does() -> None:
    body = parsed(EmbeddingsBody, b'{"model": "m", "input": "x", "whatever": {"a": 1}}')
    assert body.input == "x"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ('"n": 2', "n"),
        ('"logprobs": true', "logprobs"),
        ('"tools": [{"type": "function"}]', "tools"),
    ],
)
def test_what_tiermesh_does_not_do_is_refused(body: str, param: str) -> None:
    chat = parsed(
        ChatBody,
        f'{{"model": "m", "messages": [{{"role": "user", "content": "x"}}], {body}}}'.encode(),
    )
    with pytest.raises(ParamError) as err:
        chat_request(chat, Headers())
    assert err.value.param == param
    ok = parsed(ChatBody, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 1}')
    chat_request(ok, Headers())


def test_a_list_becomes_jobs_by_length_bucket_answered_in_order() -> None:
    cfg = minilm()
    short, mid, long = "a cat", "word " * 30, "word " * 90  # est. ~4, ~40, ~115 tokens
    texts = [short, long, short, mid] * 20 + [short] * 15
    plan = rows(EmbeddingsBody(model="minilm-l6", input=texts), cfg, None)
    assert plan.model == "minilm-l6" and plan.count == len(texts)
    covered = sorted(i for _, positions in plan.jobs for i in positions)
    assert covered == list(range(len(texts)))
    sizes = {16: 32, 64: 16, 128: 8}
    for inputs, positions in plan.jobs:
        (tensor,) = inputs
        assert tensor.name == "text" and tensor.shape == (len(positions), 1)
        lengths = {len(texts[i]) for i in positions}
        assert len(lengths) == 1  # one bucket per job
        bound = {len(short): 16, len(mid): 64, len(long): 128}[lengths.pop()]
        assert len(positions) <= sizes[bound]
        assert list(to_numpy(tensor).reshape(-1)) == [texts[i] for i in positions]
    # Short texts: 55 of them, in jobs of at most 32 (the bucket's batch size).
    assert sorted(len(p) for _, p in plan.jobs if len(texts[p[0]]) == len(short)) == [23, 32]
    # Each row's vector lands at its own position.
    parts = [(np.array([[float(i)] * 4 for i in p], np.float32), p) for _, p in plan.jobs]
    assert vectors(parts, plan.count, None)[:, 0].tolist() == list(range(len(texts)))


def test_token_ids_are_padded_rows_of_the_companion() -> None:
    cfg = minilm()
    with pytest.raises(ParamError, match="takes text, not token ids"):
        rows(EmbeddingsBody(model="minilm-l6", input=[101, 7592, 102]), cfg, None)
    companion = next(
        c for c in _companions(cfg) if {t.name for t in c.inputs} == {"input_ids", "attention_mask"}
    )
    plan = rows(
        EmbeddingsBody(model="minilm-l6", input=[[101, 7592, 102], [101, 102]]), cfg, companion
    )
    assert plan.model == "minilm-l6-ids" and plan.id_tokens == 5
    (((ids, mask), positions),) = plan.jobs
    assert positions == (0, 1)
    assert to_numpy(ids).tolist() == [[101, 7592, 102], [101, 102, 0]]
    assert to_numpy(mask).tolist() == [[1, 1, 1], [1, 1, 0]]
    with pytest.raises(ParamError, match="over the model's maximum of 256") as err:
        rows(EmbeddingsBody(model="minilm-l6", input=[[1] * 257]), cfg, companion)
    assert err.value.param == "input[0]"


def _companions(cfg: ModelConfig) -> list[ModelConfig]:
    from tiermesh.core.model_config import companions

    raw = yaml.safe_load((MODELS / "minilm-l6" / "config.yaml").read_text())
    return companions(raw, cfg, "minilm-l6")


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ([], "input", "empty"),
        ("", "input[0]", "empty string"),
        (["a", ""], "input[1]", "empty string"),
        ([[]], "input[0]", "empty list"),
        (["x"] * 2049, "input", "over the limit of 2048"),
    ],
)
def test_empty_or_too_many_inputs_are_refused(value: object, param: str, words: str) -> None:
    cfg = minilm()
    companion = _companions(cfg)[0]
    with pytest.raises(ParamError, match=words) as err:
        rows(EmbeddingsBody(model="m", input=value), cfg, companion)  # type: ignore[arg-type]
    assert err.value.param == param


def test_dimensions_only_where_the_model_allows_a_cut() -> None:
    with pytest.raises(ParamError, match="not trained for shorter ones") as err:
        rows(EmbeddingsBody(model="m", input="x", dimensions=128), minilm(), None)
    assert err.value.param == "dimensions"
    rows(EmbeddingsBody(model="m", input="x", dimensions=384), minilm(), None)  # its own size
    cut = minilm(dimensions=[128, 64])
    rows(EmbeddingsBody(model="m", input="x", dimensions=64), cut, None)
    with pytest.raises(ParamError, match=r"sizes: 128, 64, 384"):
        rows(EmbeddingsBody(model="m", input="x", dimensions=100), cut, None)
    values = np.arange(1, 9, dtype=np.float32).reshape(2, 4)
    out = vectors([(values, (0, 1))], 2, 2)
    assert out.shape == (2, 2)
    assert np.allclose(np.linalg.norm(out, axis=1), 1.0)
    assert np.allclose(out[0], np.array([1, 2]) / np.sqrt(5))
    with pytest.raises(RepositoryError, match=r"pool\.dimensions"):
        minilm(dimensions=[384])


def test_base64_is_the_float32_bytes() -> None:
    values = np.array([[0.5, -1.25, 3.0]], np.float32)
    doc = document(values, "base64", "m", 7)
    row = doc["data"][0]["embedding"]  # type: ignore[index]
    assert np.frombuffer(base64.b64decode(row), "<f4").tolist() == [0.5, -1.25, 3.0]
    assert doc["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert document(values, "float", "m", 7)["data"][0]["embedding"] == [0.5, -1.25, 3.0]  # type: ignore[index]


def test_a_chat_body_is_a_conversation_and_a_completion_a_raw_prompt() -> None:
    body = parsed(
        ChatBody,
        b'{"model": "smollm2", "messages": [{"role": "developer", "content": "Be brief."},'
        b' {"role": "user", "content": [{"type": "text", "text": "Capital of "},'
        b' {"type": "text", "text": "France?"}]}], "max_completion_tokens": 9,'
        b' "temperature": 0, "stop": "\\n", "seed": 3}',
    )
    req = chat_request(body, Headers("rid", priority=1, timeout_us=5000))
    assert req.messages == (("system", "Be brief."), ("user", "Capital of France?"))
    assert not req.raw_prompt and req.priority == 1 and req.timeout_us == 5000
    assert req.client_request_id == "rid"
    assert dict(req.parameters) == {
        "max_new_tokens": 9,
        "temperature": 0.0,
        "seed": 3,
        "stop": ["\n"],
    }
    empty = parsed(ChatBody, b'{"model": "m", "messages": [{"role": "user", "content": " "}]}')
    with pytest.raises(ParamError, match="every message is empty"):
        chat_request(empty, Headers())
    completion = completion_request(
        parsed(CompletionBody, b'{"model": "smollm2", "prompt": "Paris is"}'), Headers()
    )
    assert completion.raw_prompt and not completion.messages
    assert completion.parameters["max_new_tokens"] == 16  # OpenAI's default for completions
    with pytest.raises(ParamError, match="one prompt per request"):
        completion_request(
            parsed(CompletionBody, b'{"model": "m", "prompt": ["a", "b"]}'), Headers()
        )


def test_generation_refusals_name_openai_fields() -> None:
    err = Exception()
    assert v2_field(err, "max_new_tokens: 600 is outside 1..512") == (
        "max_tokens",
        "max_tokens: 600 is outside 1..512",
    )
    assert v2_field(err, "top_p: 0.0 is outside (0.0, 1.0]")[0] == "top_p"
    assert v2_field(err, "prompt: 3000 tokens after the chat template")[0] == ""


def test_stream_chunks_and_documents() -> None:
    chat = Completion(True, "chatcmpl-1", 5, "smollm2")
    assert chat.chunk(None)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chat.chunk("Pa")["choices"][0]["delta"] == {"content": "Pa"}
    last = chat.chunk(None, "stop")
    assert last["choices"][0] == {
        "index": 0,
        "logprobs": None,
        "finish_reason": "stop",
        "delta": {},
    }
    assert last["object"] == "chat.completion.chunk"
    assert chat.usage_chunk({"prompt_tokens": 1})["choices"] == []
    doc = chat.document("Paris.", "length", {"total_tokens": 3})
    assert doc["object"] == "chat.completion"
    assert doc["choices"][0]["message"]["content"] == "Paris."
    text = Completion(False, "cmpl-1", 5, "smollm2")
    assert text.document("x", "stop", {})["choices"][0]["text"] == "x"
    assert text.chunk("y")["object"] == "text_completion"


@pytest.mark.parametrize(
    ("status", "kind", "code"),
    [
        (400, "invalid_request_error", None),
        (401, "authentication_error", "invalid_api_key"),
        (403, "permission_error", "model_not_allowed"),
        (404, "invalid_request_error", "model_not_found"),
        (429, "rate_limit_error", "rate_limit_exceeded"),
        (503, "server_error", "service_unavailable"),
        (504, "server_error", "timeout"),
        (500, "server_error", None),
    ],
)
def test_errors_take_openai_shape(status: int, kind: str, code: str | None) -> None:
    doc = error_document(status, "the model 'x' says no", "input")
    assert doc == {
        "error": {"message": "the model 'x' says no", "type": kind, "param": "input", "code": code}
    }
