"""What `make run` starts (the default repository, both tiers, the edge worker with fewer
threads), as a caller meets it.

One model name, one answer (issue 20): a text's vector is the same within 1e-5 alone, as
any row of a batch of 1..32 among texts of other lengths, and among 64 concurrent requests,
whichever tier serves it. Light requests (rows x tokens <= 64) go to edge and the rest to
center, so the texts and batches here reach both tiers.

The response parameters the README documents: each situation sends exactly the names its
table rows say, by gRPC and by REST (the generative model's: test_generation_e2e)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import openai
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from tests.documented_parameters import PREFIX, documented, documented_for
from tests.e2e.conftest import UpProcess, start_up

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
Vector = npt.NDArray[np.float32]
ATOL = 1e-5
MAX_ROWS = 32
# Texts of different lengths (tokens with [CLS] and [SEP], MiniLM's WordPiece): 3, 6, 19,
# 47 and 92, in four length buckets. Alone, the first four are light (edge), the last heavy
# (center); every batch of more than 4 rows is heavy.
TEXTS = (
    "hi",
    "a short sentence here",
    "Edge nodes measure every request twice, then the router sends it on its way.",
    " ".join(["The gateway batches requests by length and the router picks a tier."] * 3),
    " ".join(["Heavy work goes to the center tier, where more threads run each batch."] * 6),
)
# Requests in flight at once during the batch sweep: the workers then also batch rows of
# several requests together (padded to the longest in a length bucket).
SWEEP_CONCURRENCY = 4
CALL_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def default_up(
    tmp_path_factory: pytest.TempPathFactory, fetched_models: tuple[str, ...]
) -> Iterator[UpProcess]:
    """What `make run` starts: the default repository, both tiers, default threads."""
    up = start_up(
        tmp_path_factory.mktemp("one-answer"),
        fetched=fetched_models,
        tiers=("center", "edge"),
        span_files=False,
    )
    try:
        yield up
    finally:
        up.interrupt()


@dataclass
class Answer:
    vectors: Vector
    tier: str
    variant: str


@dataclass
class Seen:
    """Every answer each text got: the largest difference from its alone vector, and the
    tiers (and sizes of the requests) that answered it."""

    alone: dict[int, Vector]
    worst: float = 0.0
    tiers: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    variants: Counter[str] = field(default_factory=Counter)

    def check(self, rows: Sequence[int], answer: Answer) -> None:
        assert answer.vectors.shape == (len(rows), 384)
        self.requests[(answer.tier, len(rows))] += 1
        self.variants[answer.variant] += 1
        for vector, text in zip(answer.vectors, rows, strict=True):
            diff = float(np.abs(vector - self.alone[text]).max())
            self.worst = max(self.worst, diff)
            assert diff <= ATOL, (
                f"text {text} on {answer.tier} in a request of {len(rows)} rows differs "
                f"from its vector alone by {diff:.3g}"
            )
            self.tiers[text].add(answer.tier)


async def ask(
    client: aioclient.InferenceServerClient,
    model: str,
    rows: Sequence[int],
    **kw: Any,
) -> Answer:
    inp = aioclient.InferInput("text", [len(rows), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[TEXTS[i].encode()] for i in rows], dtype=np.object_))
    res = await client.infer(model, [inp], client_timeout=CALL_TIMEOUT_S, **kw)
    params = res.get_response().parameters
    return Answer(
        res.as_numpy("sentence_embedding"),
        params["tiermesh.tier"].string_param,
        params["tiermesh.variant"].string_param,
    )


def sweep() -> list[list[int]]:
    """Batches of every size 1..32 in which every text sits at some row: rows cycle through
    the texts from an offset; sizes smaller than the number of texts get one batch per
    offset, so each text is row 0 of one of them."""
    batches = []
    for n in range(1, MAX_ROWS + 1):
        offsets = range(len(TEXTS)) if n < len(TEXTS) else (n % len(TEXTS),)
        batches += [[(start + j) % len(TEXTS) for j in range(n)] for start in offsets]
    return batches


def concurrent() -> list[list[int]]:
    """64 requests sent at once: one text each, every third one a batch of three."""
    return [
        [(k + j) % len(TEXTS) for j in range(3)] if k % 3 == 2 else [k % len(TEXTS)]
        for k in range(64)
    ]


@pytest.mark.parametrize("model", ["minilm-l6", "minilm-l3"])
async def test_a_text_gets_one_vector_alone_in_any_batch_and_under_load(
    default_up: UpProcess, model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    client = aioclient.InferenceServerClient(default_up.url)
    try:
        alone = [await ask(client, model, [i]) for i in range(len(TEXTS))]
        seen = Seen({i: a.vectors[0] for i, a in enumerate(alone)})
        for i, answer in enumerate(alone):
            seen.check([i], answer)  # counts the alone answers' tiers too

        slots = asyncio.Semaphore(SWEEP_CONCURRENCY)

        async def bounded(rows: list[int]) -> None:
            async with slots:
                seen.check(rows, await ask(client, model, rows))

        await asyncio.gather(*(bounded(rows) for rows in sweep()))
        load = concurrent()
        answers = await asyncio.gather(*(ask(client, model, rows) for rows in load))
        for rows, answer in zip(load, answers, strict=True):
            seen.check(rows, answer)

        # A caller naming the other variant gets it, on either tier, and is told so.
        int8 = await ask(client, model, [1], parameters={"variant": "int8"})
    finally:
        await client.close()

    with capsys.disabled():
        tiers = Counter(tier for tier, _ in seen.requests.elements())
        print(
            f"\n{model}: max |vector - alone| = {seen.worst:.3g} over "
            f"{seen.requests.total()} requests (per tier: {dict(tiers)})"
        )
    assert seen.variants == Counter({"fp32": seen.requests.total()})
    # Both tiers answered, multi-row requests included, and some text got its vector from
    # both: the property holds across tiers, not within one.
    assert {tier for tier, _ in seen.requests} == {"edge", "center"}
    assert any(tier == "edge" and rows > 1 for tier, rows in seen.requests)
    assert any(t == {"edge", "center"} for t in seen.tiers.values())
    assert int8.variant == "int8"
    assert float(np.abs(int8.vectors[0] - seen.alone[1]).max()) > ATOL


# -- the documented response parameters ------------------------------------------------


def names(result: Any) -> set[str]:
    """The mesh's parameters of a response (a caller's own would not carry the prefix)."""
    return {k for k in result.get_response().parameters if k.startswith(PREFIX)}


def mlp(client: grpcclient.InferenceServerClient, model: str, row: list[float]) -> Any:
    inp = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    inp.set_data_from_numpy(np.array([row], np.float32))
    return client.infer(model, [inp], timeout=10_000_000)


def test_computed_and_text_answers(default_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(default_up.url)
    assert names(mlp(client, "mlp", [1, 2, 3, 4])) == documented_for("always", "computed")
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"one text, one vector"]], dtype=np.object_))
    embedded = client.infer("minilm-l6", [text], timeout=10_000_000)
    assert names(embedded) == documented_for("always", "computed", "text")


def test_cache_hit_and_cascade(default_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(default_up.url)
    mlp(client, "mlp_cached", [0.5, 1.5, -2.0, 3.0])
    hit = mlp(client, "mlp_cached", [0.5, 1.5, -2.0, 3.0])
    assert names(hit) == documented_for("always", "cache hit")
    unsure = mlp(client, "mlp_cascade", [0, 0, 0, 1])  # top-1 softmax ~0.57: re-run on center
    assert names(unsure) == documented_for("always", "computed", "cascade")


def test_rest_sends_the_same_names_with_the_documented_types(default_up: UpProcess) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]
    }
    request = urllib.request.Request(
        f"http://{default_up.rest_url()}/v2/models/mlp/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        params = json.loads(resp.read())["parameters"]
    assert set(params) == documented_for("always", "computed")
    python_type = {"double": float, "int64": int, "string": str, "bool": bool}
    table = documented()
    assert {k: type(v) for k, v in params.items()} == {k: python_type[table[k][0]] for k in params}


# -- the OpenAI door (issue 25) ----------------------------------------------------------


async def test_the_openai_door_gives_each_text_its_vector_in_order(default_up: UpProcess) -> None:
    """The default mesh (the Go front door on gRPC, no keys): a list of texts of every
    length through `/v1/embeddings` (jobs grouped by length bucket, on both tiers) answers
    each text with its vector alone, in the caller's order."""
    client = aioclient.InferenceServerClient(default_up.url)
    try:
        alone = [(await ask(client, "minilm-l6", [i])).vectors[0] for i in range(len(TEXTS))]
    finally:
        await client.close()
    order = [i % len(TEXTS) for i in range(7 * len(TEXTS))][::-1]
    oa = openai.AsyncOpenAI(
        base_url=f"http://{default_up.rest_url()}/v1", api_key="unused", max_retries=0
    )
    try:
        got = await oa.embeddings.create(model="minilm-l6", input=[TEXTS[i] for i in order])
    finally:
        await oa.close()
    assert [d.index for d in got.data] == list(range(len(order)))
    for d, text in zip(got.data, order, strict=True):
        assert float(np.abs(np.array(d.embedding, np.float32) - alone[text]).max()) <= ATOL
