"""The text path end to end in pieces: tokenize (router), pad + run (worker), pool (postprocess)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.model_config import PoolSpec
from tiermesh.core.output_steps import OutputSteps, mean_pool_l2
from tiermesh.core.repository import ModelConfig, parse_config
from tiermesh.core.tensors import TensorData, from_numpy, to_numpy
from tiermesh.core.text import PARALLEL_FROM, TextEncoder
from tiermesh.worker.runner import ModelRunner, pad_to

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "world", "the", "cat", "sat", "on"]
WORDS += ["mat", "a", "b", "c", "d", "e", "f", "g", "dog", "ran", "##s", ",", ".", "!", "?"]
VOCAB = {w: i for i, w in enumerate(WORDS)}
CLS, SEP, UNK = VOCAB["[CLS]"], VOCAB["[SEP]"], VOCAB["[UNK]"]


def _tokenizer_file(path: Path, *, pad_to_length: int = 0, truncate_at: int = 0) -> Path:
    tok = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", CLS), ("[SEP]", SEP)]
    )
    if pad_to_length:
        tok.enable_padding(length=pad_to_length, pad_id=0, pad_token="[PAD]")
    if truncate_at:
        tok.enable_truncation(truncate_at)
    tok.save(str(path))
    return path


@pytest.fixture
def encoder(tmp_path: Path) -> TextEncoder:
    return TextEncoder(_tokenizer_file(tmp_path / "tokenizer.json"), max_length=6)


# -- TextEncoder ---------------------------------------------------------------------------


def test_encode_pads_to_longest_in_request(encoder: TextEncoder) -> None:
    enc = encoder.encode(["Hello WORLD!", "the"])
    assert enc.input_ids.dtype == np.int64 and enc.attention_mask.dtype == np.int64
    assert enc.input_ids.tolist() == [
        [CLS, VOCAB["hello"], VOCAB["world"], VOCAB["!"], SEP],
        [CLS, VOCAB["the"], SEP, 0, 0],
    ]
    assert enc.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    assert enc.truncated is False
    # WordPiece splits known sub-words and maps the rest to [UNK].
    wp = encoder.encode(["Cats zebra"]).input_ids.tolist()
    assert wp == [[CLS, VOCAB["cat"], VOCAB["##s"], UNK, SEP]]


@pytest.mark.parametrize(
    ("text", "truncated"),
    [("a b c d", False), ("a b c d e", True), ("a b c d e f g", True), ("", False)],
)
def test_truncation_at_max_length(encoder: TextEncoder, text: str, truncated: bool) -> None:
    enc = encoder.encode([text, "a"])
    assert enc.input_ids.shape[1] <= 6
    assert enc.input_ids[0, 0] == CLS
    assert enc.input_ids[0, enc.attention_mask[0].sum() - 1] == SEP
    assert enc.truncated is truncated


def test_truncated_when_any_element_is(encoder: TextEncoder) -> None:
    enc = encoder.encode(["a", "a b c d e f", "b"])
    assert enc.truncated is True
    assert enc.input_ids[1].tolist() == [CLS, *(VOCAB[w] for w in "abcd"), SEP]


def test_tokenizer_file_padding_and_truncation_overridden(tmp_path: Path) -> None:
    # Like the real MiniLM tokenizer.json, which pads every sequence to 128.
    path = _tokenizer_file(tmp_path / "t.json", pad_to_length=128, truncate_at=512)
    enc = TextEncoder(path, max_length=6).encode(["hello", "a b c d e f g"])
    assert enc.input_ids.shape == (2, 6)
    assert enc.input_ids[0].tolist() == [CLS, VOCAB["hello"], SEP, 0, 0, 0]
    assert enc.truncated is True


def test_encode_tensor(encoder: TextEncoder) -> None:
    text = from_numpy("text", np.array([["Hello"], ["the cat sat"]], dtype=object), "BYTES")
    (ids, mask), truncated = encoder.encode_tensor(text)
    assert (ids.name, ids.datatype, ids.shape) == ("input_ids", "INT64", (2, 5))
    assert (mask.name, mask.datatype, mask.shape) == ("attention_mask", "INT64", (2, 5))
    assert to_numpy(ids).tolist() == [
        [CLS, VOCAB["hello"], SEP, 0, 0],
        [CLS, VOCAB["the"], VOCAB["cat"], VOCAB["sat"], SEP],
    ]
    assert to_numpy(mask).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert truncated is False


def test_encode_many_pads_each_request_to_its_own_longest_text(encoder: TextEncoder) -> None:
    """One encode_batch call for a whole batch of requests: each request comes back as
    encode_tensor would encode it alone (its own padding, its own truncated flag)."""
    texts = [
        from_numpy("text", np.array([["the cat sat"]], dtype=object), "BYTES"),
        from_numpy("text", np.array([["Hello"], ["the cat sat"]], dtype=object), "BYTES"),
        from_numpy("text", np.array([["a b c d e f g"]], dtype=object), "BYTES"),
    ]
    many = encoder.encode_many(texts)
    assert [m[1] for m in many] == [False, False, True]
    for text, ((ids, mask), truncated) in zip(texts, many, strict=True):
        (one_ids, one_mask), one_truncated = encoder.encode_tensor(text)
        assert (ids, mask, truncated) == (one_ids, one_mask, one_truncated)
    (ids, _), _ = many[0]
    assert ids.shape == (1, 5)  # not padded to the longest of the batch
    assert to_numpy(many[1][0][1]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert encoder.encode_many([]) == []


def test_many_texts_at_once_encode_as_few_do(encoder: TextEncoder) -> None:
    """From PARALLEL_FROM texts one encode_batch call, below it one encode a text: the
    same ids, masks and truncated flags either way."""
    words = ["the cat sat", "Hello", "a b c d e f g", "the", "cat sat the cat"]
    texts = [
        from_numpy("text", np.array([[words[i % len(words)]]], dtype=object), "BYTES")
        for i in range(PARALLEL_FROM + 3)
    ]
    together = encoder.encode_many(texts)
    apart = [encoder.encode_many(texts[i : i + 1])[0] for i in range(len(texts))]
    assert together == apart
    assert any(truncated for _, truncated in together)


# -- pad_to --------------------------------------------------------------------------------


def test_pad_to_pads_every_non_batch_dim_at_its_end() -> None:
    arr = np.arange(12, dtype=np.int64).reshape(2, 2, 3)
    out = pad_to(from_numpy("x", arr, "INT64"), (4, 5), value=-7)
    assert (out.name, out.datatype, out.shape) == ("x", "INT64", (2, 4, 5))
    got = to_numpy(out)
    np.testing.assert_array_equal(got[:, :2, :3], arr)
    assert (got[:, 2:, :] == -7).all() and (got[:, :, 3:] == -7).all()
    assert pad_to(out, (4, 5), value=9) is out  # already the shape: untouched


# -- ModelRunner ---------------------------------------------------------------------------


def _onnx_model(path: Path) -> Path:
    """hidden[b, l, 0] = float(input_ids[b, l] * attention_mask[b, l])."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
            helper.make_node("Cast", ["kept"], ["kept_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["kept_f", "axis"], ["last_hidden_state"]),
        ],
        "masked_ids",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "L"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "L"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["B", "L", 1])],
        [helper.make_tensor("axis", TensorProto.INT64, [1], [-1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _runner_cfg(max_batch_size: int = 8, pad_ids: int = 0, pool: bool = False) -> ModelConfig:
    dims = [-1] if max_batch_size else [-1, -1]
    ids = [
        {"name": "input_ids", "datatype": "INT64", "dims": dims},
        {"name": "attention_mask", "datatype": "INT64", "dims": dims},
    ]
    raw = {
        "name": "masked",
        "max_batch_size": max_batch_size,
        "inputs": [{"name": "text", "datatype": "BYTES", "dims": [1]}],
        "outputs": [{"name": "sentence_embedding", "datatype": "FP32", "dims": [1]}],
        "compute": {
            "inputs": ids,
            "outputs": [{"name": "last_hidden_state", "datatype": "FP32", "dims": [*dims, 1]}],
            "pad": {"input_ids": pad_ids, "attention_mask": 0},
        },
        "versions": {"1": {"model.onnx": "0" * 64}},
    }
    if pool:
        raw["pool"] = {"source": SPEC.source, "mask": SPEC.mask, "output": SPEC.output}
    return parse_config(raw, "test")


class _CountingSession:
    def __init__(self, session: Any) -> None:
        self.session, self.calls = session, 0

    def run(self, *args: Any) -> Any:
        self.calls += 1
        return self.session.run(*args)


def _job(rid: str, ids: list[list[int]]) -> Job:
    arr = np.array(ids, dtype=np.int64)
    mask = (arr > 0).astype(np.int64)
    inputs = (from_numpy("input_ids", arr, "INT64"), from_numpy("attention_mask", mask, "INT64"))
    return Job(rid, "masked", inputs, "gw")


def _np(tensor: TensorData) -> np.ndarray[Any, Any]:
    return to_numpy(tensor)


def _named(tensors: tuple[TensorData, ...], name: str) -> np.ndarray[Any, Any]:
    return _np(next(t for t in tensors if t.name == name))


@pytest.mark.parametrize("pad_ids", [0, 7])
def test_runner_pads_batch_to_longest(tmp_path: Path, pad_ids: int) -> None:
    runner = ModelRunner(_runner_cfg(pad_ids=pad_ids), _onnx_model(tmp_path / "m.onnx"))
    runner.session = counter = _CountingSession(runner.session)
    jobs = [_job("a", [[5, 6, 7]]), _job("b", [[1, 2, 3, 4, 9], [8, 0, 0, 0, 0]]), _job("c", [[3]])]
    results = runner.run(jobs)
    assert counter.calls == 1
    assert len(results) == 3
    for job, res in zip(jobs, results, strict=True):
        ids = _np(job.inputs[0])
        rows, length = ids.shape
        padded_ids = _named(res.padded_inputs, "input_ids")
        padded_mask = _named(res.padded_inputs, "attention_mask")
        assert padded_ids.shape == padded_mask.shape == (rows, 5)
        np.testing.assert_array_equal(padded_ids[:, :length], ids)
        assert (padded_ids[:, length:] == pad_ids).all()
        assert (padded_mask[:, length:] == 0).all()
        (out,) = res.outputs
        assert (out.name, out.datatype, out.shape) == ("last_hidden_state", "FP32", (rows, 5, 1))
        # What ran is exactly the padded inputs; padding only shows through the mask.
        np.testing.assert_array_equal(_np(out)[:, :, 0], padded_ids * padded_mask)
        np.testing.assert_array_equal(_np(out)[:, :length, 0], ids * (ids > 0))


def test_runner_without_batching_runs_each_job_alone(tmp_path: Path) -> None:
    cfg = _runner_cfg(max_batch_size=0)
    runner = ModelRunner(cfg, _onnx_model(tmp_path / "m.onnx"))
    runner.session = counter = _CountingSession(runner.session)
    jobs = [_job("a", [[5, 6, 7]]), _job("b", [[1, 2, 3, 4, 9]])]
    results = runner.run(jobs)
    assert counter.calls == 2
    for job, res in zip(jobs, results, strict=True):
        assert res.padded_inputs == job.inputs  # no padding
        ids = _np(job.inputs[0])
        np.testing.assert_array_equal(_np(res.outputs[0])[..., 0], ids)


# -- mean_pool_l2 --------------------------------------------------------------------------

SPEC = PoolSpec("last_hidden_state", "attention_mask", "sentence_embedding")


def _pool_result(tokens: np.ndarray, mask: np.ndarray, **fields: Any) -> JobResult:
    return JobResult(
        request_id="r",
        model="txt",
        gateway="gw",
        outputs=(from_numpy(SPEC.source, tokens, "FP32"),),
        aux=(from_numpy(SPEC.mask, mask, "INT64"),),
        **fields,
    )


def test_mean_pool_l2_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.standard_normal((3, 5, 8)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=np.int64)
    result = mean_pool_l2(SPEC)(_pool_result(tokens, mask, annotations={"truncated": "true"}))
    (out,) = result.outputs
    assert (out.name, out.datatype, out.shape) == ("sentence_embedding", "FP32", (3, 8))
    expected = np.stack([tokens[i, : mask[i].sum()].mean(axis=0) for i in range(3)])
    expected /= np.linalg.norm(expected, axis=1, keepdims=True)
    np.testing.assert_allclose(_np(out), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(_np(out), axis=1), 1.0, rtol=1e-6)
    assert result.aux == ()
    assert result.annotations == {"truncated": "true"}


def test_padded_tokens_do_not_change_the_embedding() -> None:
    rng = np.random.default_rng(4)
    tokens = rng.standard_normal((1, 3, 8)).astype(np.float32)
    garbage = 100 * rng.standard_normal((1, 4, 8)).astype(np.float32)
    step = mean_pool_l2(SPEC)
    short = step(_pool_result(tokens, np.ones((1, 3), np.int64)))
    padded = step(
        _pool_result(np.concatenate([tokens, garbage], axis=1), np.array([[1, 1, 1, 0, 0, 0, 0]]))
    )
    np.testing.assert_allclose(_np(padded.outputs[0]), _np(short.outputs[0]), rtol=1e-6, atol=1e-7)


def test_all_masked_row_gives_zeros_not_nan() -> None:
    tokens = np.ones((1, 2, 4), np.float32)
    out = mean_pool_l2(SPEC)(_pool_result(tokens, np.zeros((1, 2), np.int64)))
    assert _np(out.outputs[0]).tolist() == [[0.0, 0.0, 0.0, 0.0]]


def _steps() -> OutputSteps:
    pooled = _runner_cfg(pool=True)
    assert pooled.pool == SPEC
    return OutputSteps.for_models({"txt": pooled, "plain": _runner_cfg()})


def test_failed_result_passes_untouched() -> None:
    tokens, mask = np.ones((1, 2, 8), np.float32), np.ones((1, 2), np.int64)
    failed = _pool_result(tokens, mask, code=grpc.StatusCode.DEADLINE_EXCEEDED)
    assert _steps().apply(failed) is failed


def test_steps_for_models_picks_only_pooled_models() -> None:
    steps = _steps()
    tokens, mask = np.ones((1, 2, 8), np.float32), np.ones((1, 2), np.int64)
    pooled = steps.apply(_pool_result(tokens, mask))
    assert [o.name for o in pooled.outputs] == [SPEC.output]
    plain = _pool_result(tokens, mask).with_(model="plain")
    assert steps.apply(plain) is plain
    unknown = plain.with_(model="nope")
    assert steps.apply(unknown) is unknown
