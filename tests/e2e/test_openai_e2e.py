"""The OpenAI door through the whole mesh (issue 25), with the official `openai` client,
unmodified, as the only client of the door: embeddings of the real MiniLM-L6 equal to the v2
answers in the caller's order (float, base64, token ids), chat and completions of the real
SmolLM2 equal to the v2 greedy answer, streamed and not, a stream closed early freeing its
slot, and every refusal as the client's own typed exception. API keys are on, so the Python
gateway serves every door; the default mesh's door is tried in test_default_mesh_e2e."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from tests.e2e.conftest import UpProcess, service_metric, start_up
from tests.e2e.sentences import sentences
from tests.e2e.test_generation_e2e import worker_metric
from tests.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODELS = Path(__file__).resolve().parents[2] / "models"
APP = "app-" + secrets.token_urlsafe(24)
NARROW = "narrow-" + secrets.token_urlsafe(24)  # minilm-l6 only
SCARCE = "scarce-" + secrets.token_urlsafe(24)  # two calls, then none
QUESTION = "What is the capital of France?"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


TENANTS = f"""
tenants:
  - name: app
    key_sha256: [{sha(APP)}]
    models: "*"
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
  - name: narrow
    key_sha256: [{sha(NARROW)}]
    models: [minilm-l6]
    rate: {{requests_per_s: 1000, burst: 1000}}
    max_in_flight: 64
  - name: scarce
    key_sha256: [{sha(SCARCE)}]
    models: "*"
    rate: {{requests_per_s: 0.01, burst: 2}}
    max_in_flight: 64
"""


def cache_and_cut(repo: Path) -> None:
    """minilm-l6 with a response cache, and a cut to 128 values allowed (the door's
    `dimensions`; the mechanics only: this model was not trained for it)."""
    config = repo / "minilm-l6" / "config.yaml"
    text = config.read_text().replace(
        "output: sentence_embedding}", "output: sentence_embedding, dimensions: [128]}"
    )
    assert "dimensions: [128]" in text
    config.write_text(text + "response_cache: {enabled: true, ttl_s: 60}\n")


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    for model in ("minilm-l6", "smollm2"):
        if not (MODELS / model / "1" / "model.onnx").is_file():
            pytest.fail(f"models/{model} is not fetched: run `tiermesh models fetch {model}`")
    tmp = tmp_path_factory.mktemp("openai")
    (tmp / "tenants.yaml").write_text(TENANTS)
    up = start_up(
        tmp,
        fetched=["minilm-l6", "smollm2"],
        extra_env={"TIERMESH_TENANTS_FILE": str(tmp / "tenants.yaml")},
        repository_hook=cache_and_cut,
    )
    try:
        yield up
    finally:
        if up.proc.poll() is None:
            up.interrupt()


def client(mesh: UpProcess, key: str = APP) -> openai.OpenAI:
    # No retries: a refusal is asserted as it comes.
    return openai.OpenAI(base_url=f"http://{mesh.rest_url()}/v1", api_key=key, max_retries=0)


def v2_vectors(mesh: UpProcess, texts: list[str], rows: int = 25) -> np.ndarray:
    """The texts through v2 gRPC (tritonclient), `rows` a request: the reference."""
    grpc = grpcclient.InferenceServerClient(mesh.url)
    try:
        out = []
        for start in range(0, len(texts), rows):
            chunk = texts[start : start + rows]
            x = grpcclient.InferInput("text", [len(chunk), 1], "BYTES")
            x.set_data_from_numpy(np.array([[t.encode()] for t in chunk], dtype=object))
            result = grpc.infer("minilm-l6", [x], headers={"authorization": f"Bearer {APP}"})
            out.append(result.as_numpy("sentence_embedding"))
        return np.concatenate(out)
    finally:
        grpc.close()


def minilm_tokenizer() -> Tokenizer:
    """MiniLM-L6's tokenizer as the router runs it: the file pads to 128 tokens and cuts
    at 128; the router does neither (the model's max_length is 256)."""
    tokenizer = Tokenizer.from_file(str(MODELS / "minilm-l6" / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_embeddings_of_a_list_equal_v2_in_order(mesh: UpProcess) -> None:
    # Short and long texts mixed: the list goes as several jobs, by length bucket.
    tokenizer = minilm_tokenizer()
    fits = [s for s in sentences(200) if s.strip() and len(tokenizer.encode(s).ids) <= 256]
    texts = fits[:100]
    assert len(texts) == 100 and max(len(t) for t in texts) > 4 * min(len(t) for t in texts)
    reference = v2_vectors(mesh, texts)
    oa = client(mesh)
    floats = oa.embeddings.create(model="minilm-l6", input=texts, encoding_format="float")
    assert [d.index for d in floats.data] == list(range(100))
    got = np.array([d.embedding for d in floats.data], dtype=np.float32)
    assert cosines(got, reference).min() >= 0.99999
    # The client's default asks for base64 and decodes it; asked for, base64 comes as is.
    default = oa.embeddings.create(model="minilm-l6", input=texts)
    assert np.array_equal(np.array([d.embedding for d in default.data], np.float32), got)
    b64 = oa.embeddings.create(model="minilm-l6", input=texts[:10], encoding_format="base64")
    decoded = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in b64.data])
    assert np.array_equal(decoded, got[:10])
    # usage: the tokens our tokenizer counts (what the model computes, [CLS]/[SEP] in).
    counted = sum(len(e.ids) for e in tokenizer.encode_batch(texts))
    assert floats.usage.prompt_tokens == counted == floats.usage.total_tokens
    assert floats.model == "minilm-l6" and floats.object == "list"


def test_token_ids_and_a_single_string(mesh: UpProcess) -> None:
    texts = ["A cat sits on the mat.", "Redis streams hold the queues of every worker tier."]
    tokenizer = minilm_tokenizer()
    ids = [e.ids for e in tokenizer.encode_batch(texts)]
    oa = client(mesh)
    by_text = np.array(
        [d.embedding for d in oa.embeddings.create(model="minilm-l6", input=texts).data]
    )
    by_ids = oa.embeddings.create(model="minilm-l6", input=ids)
    assert by_ids.usage.prompt_tokens == sum(len(i) for i in ids)
    assert cosines(np.array([d.embedding for d in by_ids.data]), by_text).min() >= 0.99999
    one = oa.embeddings.create(model="minilm-l6", input=ids[0]).data
    assert len(one) == 1 and cosines(np.array([one[0].embedding]), by_text[:1])[0] >= 0.99999
    single = oa.embeddings.create(model="minilm-l6", input=texts[1]).data
    assert cosines(np.array([single[0].embedding]), by_text[1:])[0] >= 0.99999


def test_dimensions_cache_headers_and_models(mesh: UpProcess) -> None:
    oa = client(mesh)
    text = "The cache answers a repeated text without computing it."
    full = np.array(oa.embeddings.create(model="minilm-l6", input=[text]).data[0].embedding)
    cut = np.array(
        oa.embeddings.create(model="minilm-l6", input=[text], dimensions=128).data[0].embedding
    )
    assert cut.shape == (128,) and abs(np.linalg.norm(cut) - 1) < 1e-5
    assert np.allclose(cut, full[:128] / np.linalg.norm(full[:128]), atol=1e-6)
    with pytest.raises(openai.BadRequestError) as err:
        oa.embeddings.create(model="minilm-l6", input=[text], dimensions=100)
    assert err.value.param == "dimensions"
    # The response cache: the same text again is answered without a worker.
    raw = oa.embeddings.with_raw_response.create(
        model="minilm-l6", input=[text], extra_headers={"x-request-id": "mine-1"}
    )
    assert raw.headers["x-tiermesh-cache-hit"] == "true"
    assert raw.headers["x-request-id"] == "mine-1"
    fresh = oa.embeddings.with_raw_response.create(
        model="minilm-l6", input=["Another text, computed once."]
    )
    for stage in ("preprocess", "queue", "compute", "total"):
        assert float(fresh.headers[f"x-tiermesh-{stage}-ms"]) >= 0
    assert fresh.headers["x-tiermesh-tier"] in ("edge", "center")
    assert {m.id for m in oa.models.list().data} == {"minilm-l6", "smollm2"}
    assert oa.models.retrieve("smollm2").owned_by == "tiermesh"
    narrow = [m.id for m in client(mesh, NARROW).models.list().data]
    assert narrow == ["minilm-l6"]


def test_one_trace_holds_the_call_and_each_of_its_jobs(mesh: UpProcess) -> None:
    """A short and a long text: two jobs (two length buckets) under the call's SERVER span,
    each routed, queued and computed in the same trace."""
    client(mesh).embeddings.create(
        model="minilm-l6",
        input=["hi", "word " * 60],
        extra_headers={"x-request-id": "traced-openai"},
    )

    def server_span() -> list[dict[str, object]]:
        return [
            s
            for s in mesh.spans()
            if s["name"] == "POST /v1/embeddings"
            and s["attributes"].get("tiermesh.client_request_id") == "traced-openai"
        ]

    eventually(lambda: server_span(), "the call's SERVER span")
    trace_id = server_span()[0]["context"]["trace_id"]  # type: ignore[index]

    def in_trace() -> list[dict[str, object]]:
        return [s for s in mesh.spans() if s["context"]["trace_id"] == trace_id]

    eventually(lambda: sum(s["name"] == "compute" for s in in_trace()) == 2, "both jobs computed")
    names = [s["name"] for s in in_trace()]
    assert names.count("route") == 2 and names.count("queue wait") == 2
    services = {s["resource"]["attributes"]["service.name"] for s in in_trace()}  # type: ignore[index]
    assert {"tiermesh-gateway", "tiermesh-router", "tiermesh-worker"} <= services


def v2_greedy(mesh: UpProcess, prompt: str, max_new_tokens: int) -> str:
    grpc = grpcclient.InferenceServerClient(mesh.url)
    try:
        x = grpcclient.InferInput("text_input", [1], "BYTES")
        x.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
        result = grpc.infer(
            "smollm2",
            [x],
            parameters={"max_new_tokens": max_new_tokens, "temperature": 0.0},
            headers={"authorization": f"Bearer {APP}"},
        )
        return str(result.as_numpy("text_output")[0].decode())
    finally:
        grpc.close()


def test_chat_equals_the_v2_greedy_answer_streamed_or_not(mesh: UpProcess) -> None:
    expected = v2_greedy(mesh, QUESTION, 12)
    assert "Paris" in expected
    oa = client(mesh)
    messages = [{"role": "user", "content": QUESTION}]
    whole = oa.chat.completions.create(
        model="smollm2",
        messages=messages,
        temperature=0,
        max_tokens=12,  # type: ignore[arg-type]
    )
    choice = whole.choices[0]
    assert choice.message.content == expected and choice.message.role == "assistant"
    assert choice.finish_reason == "stop" and whole.object == "chat.completion"
    usage = whole.usage
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 20
    chunks = list(
        oa.chat.completions.create(
            model="smollm2",
            messages=messages,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    with_choices = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in with_choices) == expected
    assert with_choices[-1].choices[0].finish_reason == "stop"
    assert all(c.choices[0].finish_reason is None for c in with_choices[:-1])
    assert len(with_choices) > 3  # pieces, not one block
    assert chunks[-1].usage is not None and chunks[-1].usage == usage
    # A system message and an earlier turn change the prompt the template renders.
    longer = oa.chat.completions.create(
        model="smollm2",
        messages=[  # type: ignore[list-item]
            {"role": "system", "content": "You answer in one word."},
            {"role": "user", "content": QUESTION},
        ],
        temperature=0,
        max_tokens=12,
    )
    assert longer.usage is not None and longer.usage.prompt_tokens != usage.prompt_tokens
    # max_tokens is honoured: "length" when the answer is cut.
    cut = oa.chat.completions.create(
        model="smollm2",
        messages=messages,
        temperature=0,
        max_tokens=3,  # type: ignore[arg-type]
    )
    assert cut.choices[0].finish_reason == "length" and cut.usage.completion_tokens == 3  # type: ignore[union-attr]
    assert expected.startswith(cut.choices[0].message.content or "?")


def test_completions_take_the_prompt_as_it_is(mesh: UpProcess) -> None:
    oa = client(mesh)
    done = oa.completions.create(model="smollm2", prompt="The capital of France is", temperature=0)
    assert done.choices[0].text.strip() and done.object == "text_completion"
    # No chat template around it: the prompt's own five tokens.
    assert done.usage is not None and done.usage.prompt_tokens == 5
    assert done.usage.completion_tokens == 16  # OpenAI's default max_tokens
    streamed = oa.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == done.choices[0].text


def test_the_async_client(mesh: UpProcess) -> None:
    async def main() -> tuple[int, str]:
        oa = openai.AsyncOpenAI(base_url=f"http://{mesh.rest_url()}/v1", api_key=APP, max_retries=0)
        try:
            embedded, chat = await asyncio.gather(
                oa.embeddings.create(model="minilm-l6", input=["one", "two", "three"]),
                oa.chat.completions.create(
                    model="smollm2",
                    messages=[{"role": "user", "content": QUESTION}],
                    temperature=0,
                    max_tokens=12,
                ),
            )
            pieces = []
            stream = await oa.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0,
                max_tokens=12,
                stream=True,
            )
            async for chunk in stream:
                pieces.append(chunk.choices[0].delta.content or "")
            assert "".join(pieces) == chat.choices[0].message.content
            return len(embedded.data), chat.choices[0].message.content or ""
        finally:
            await oa.close()

    count, text = asyncio.run(main())
    assert count == 3 and text == v2_greedy(mesh, QUESTION, 12)


def test_closing_a_stream_early_frees_its_slot(mesh: UpProcess) -> None:
    cancelled = worker_metric(mesh, "tiermesh_generation_requests_total", reason="cancelled")
    stream = client(mesh).chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        max_tokens=400,
        stream=True,
    )
    got = 0
    for _ in stream:
        got += 1
        if got == 3:
            break
    eventually(lambda: worker_metric(mesh, "tiermesh_generation_sequences") == 1, "one sequence")
    stream.close()
    eventually(
        lambda: (
            worker_metric(mesh, "tiermesh_generation_requests_total", reason="cancelled")
            > cancelled
        ),
        "the worker to count the cancelled request",
    )
    eventually(
        lambda: (
            worker_metric(mesh, "tiermesh_generation_sequences") == 0
            and worker_metric(mesh, "tiermesh_generation_kv_reserved_tokens") == 0
        ),
        "the slot and its KV reservation to be freed",
    )


def test_refusals_are_the_clients_typed_exceptions(mesh: UpProcess) -> None:
    oa = client(mesh)
    chat = [{"role": "user", "content": QUESTION}]
    with pytest.raises(openai.NotFoundError) as nf:
        oa.embeddings.create(model="no-such-model", input="x")
    assert nf.value.code == "model_not_found"
    cases = [
        (lambda: oa.embeddings.create(model="minilm-l6", input=""), "input[0]"),
        (lambda: oa.embeddings.create(model="minilm-l6", input=[]), "input"),
        (lambda: oa.embeddings.create(model="minilm-l6", input=5), "input"),  # type: ignore[arg-type]
        (lambda: oa.embeddings.create(model="minilm-l6", input="word " * 400), "input"),
        (lambda: oa.embeddings.create(model="minilm-l6", input=[[7] * 300]), "input[0]"),
        (lambda: oa.embeddings.create(model="smollm2", input="x"), "model"),
        (lambda: oa.chat.completions.create(model="minilm-l6", messages=chat), "model"),  # type: ignore[arg-type]
        (
            lambda: oa.chat.completions.create(model="smollm2", messages=chat, max_tokens=100000),  # type: ignore[arg-type]
            "max_tokens",
        ),
        (
            lambda: oa.chat.completions.create(
                model="smollm2",
                messages=[{"role": "user", "content": "word " * 2100}],
            ),
            None,  # the prompt over the context, found by the router once templated
        ),
        (lambda: oa.chat.completions.create(model="smollm2", messages=chat, n=2), "n"),  # type: ignore[arg-type]
        (
            lambda: oa.chat.completions.create(
                model="smollm2",
                messages=chat,  # type: ignore[arg-type]
                extra_body={"temperature": "hot"},
            ),
            "temperature",
        ),
        (lambda: oa.chat.completions.create(model="smollm2", messages=[]), "messages"),
    ]
    for call, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            call()
        assert bad.value.param == param, bad.value.body
        assert bad.value.status_code == 400 and bad.value.type == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError) as auth:
        client(mesh, "not-a-key").embeddings.create(model="minilm-l6", input="x")
    assert auth.value.code == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError):
        client(mesh, NARROW).chat.completions.create(model="smollm2", messages=chat)  # type: ignore[arg-type]
    scarce = client(mesh, SCARCE)
    with pytest.raises(openai.RateLimitError) as limited:
        for _ in range(4):
            scarce.embeddings.create(model="minilm-l6", input="x")
    assert int(limited.value.response.headers["retry-after"]) >= 1
    # What OpenAI has no field for: headers, checked as strictly.
    with pytest.raises(openai.BadRequestError) as header:
        oa.embeddings.create(
            model="minilm-l6", input="x", extra_headers={"x-tiermesh-priority": "high"}
        )
    assert header.value.param == "x-tiermesh-priority"
    with pytest.raises(openai.BadRequestError):
        oa.embeddings.create(
            model="minilm-l6", input="x", extra_headers={"x-tiermesh-priority": "9"}
        )
    with pytest.raises(openai.InternalServerError) as late:
        oa.chat.completions.create(
            model="smollm2",
            messages=chat,  # type: ignore[arg-type]
            max_tokens=300,
            extra_headers={"x-tiermesh-timeout-ms": "50"},
        )
    assert late.value.status_code == 504
    # A route the door does not have: OpenAI's shape too.
    request = urllib.request.Request(
        f"http://{mesh.rest_url()}/v1/images/generations",
        data=b"{}",
        headers={"authorization": f"Bearer {APP}"},
    )
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=10)
    assert missing.value.code == 404
    assert b'"type": "invalid_request_error"' in missing.value.read()
    # Counted by door, endpoint and status.
    counted = service_metric(
        mesh, "gateway", "tiermesh_openai_requests_total", endpoint="embeddings", status="400"
    )
    assert counted >= 6
