"""Model variants, calibration, node sensitivity and mixed precision on a tiny random BERT
(built with the project's graph builder) and a tiny WordPiece tokenizer; the shipped text
sets and the user text-file reader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from tiermesh.convert.bert_graph import BertConfig, build_bert_onnx
from tiermesh.core.repository import sha256_file
from tiermesh.core.text import TextEncoder
from tiermesh.optimize import gated, variants
from tiermesh.optimize.calibrate import TextCalibrationReader
from tiermesh.optimize.datasets import builtin_texts, read_texts, texts_sha256
from tiermesh.optimize.gate import AccuracyGate
from tiermesh.optimize.sensitivity import mixed_precision, node_sensitivity
from tiermesh.worker.runner import session_options

WORDS = [
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "model", "server", "batch", "queue", "fast",
    "slow", "request", "latency", "cat", "sat", "on", "mat", "is", "a", "of", "##s", "##ing",
    "1", "2", "3", ".", ",", "?",
]  # fmt: skip
VOCAB = {w: i for i, w in enumerate(WORDS)}
CFG = BertConfig(
    vocab_size=len(WORDS),
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
    type_vocab_size=2,
    layer_norm_eps=1e-12,
)
TEXTS = [
    "the model is fast",
    "the server queue is slow , the latency of a request",
    "a cat sat on the mat",
    "batch 1 2 3 . requests ?",
    "the slow server of the fast model is batching the queue",
    "latency",
    "the cat sat on a mat on the mat , the model is slow ?",
    "queue of requests . batch of 3",
]


def _weights(cfg: BertConfig, seed: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, i = cfg.hidden_size, cfg.intermediate_size

    def t(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {
        "embeddings.word_embeddings.weight": t(cfg.vocab_size, h, scale=1.0),
        "embeddings.position_embeddings.weight": t(cfg.max_position_embeddings, h),
        "embeddings.token_type_embeddings.weight": t(cfg.type_vocab_size, h),
        "embeddings.LayerNorm.weight": 1 + t(h, scale=0.1),
        "embeddings.LayerNorm.bias": t(h, scale=0.1),
    }
    for n in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{n}."
        for proj in ("attention.self.query", "attention.self.key", "attention.self.value",
                     "attention.output.dense"):  # fmt: skip
            w[f"{p}{proj}.weight"] = t(h, h)
            w[f"{p}{proj}.bias"] = t(h)
        w[f"{p}intermediate.dense.weight"] = t(i, h)
        w[f"{p}intermediate.dense.bias"] = t(i)
        w[f"{p}output.dense.weight"] = t(h, i)
        w[f"{p}output.dense.bias"] = t(h)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}{ln}.weight"] = 1 + t(h, scale=0.1)
            w[f"{p}{ln}.bias"] = t(h, scale=0.1)
    return w


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    onnx.save(build_bert_onnx(_weights(CFG), CFG), str(path))
    return path


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> TextEncoder:
    tok = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])],
    )
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return TextEncoder(path, 32)


@pytest.fixture(scope="module")
def reader_factory(encoder: TextEncoder) -> Callable[[], TextCalibrationReader]:
    return lambda: TextCalibrationReader(encoder, TEXTS, batch_size=3)


def _run(path: Path, encoder: TextEncoder) -> tuple[ort.InferenceSession, np.ndarray]:
    opts = session_options(1)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    enc = encoder.encode(TEXTS)
    (out,) = session.run(None, {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask})
    return session, np.asarray(out)


def _io(session: ort.InferenceSession) -> list[tuple[str, str]]:
    return [(a.name, a.type) for a in [*session.get_inputs(), *session.get_outputs()]]


def _min_token_cosine(a: np.ndarray, b: np.ndarray) -> float:
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return float(cos.min())


def _float_matmul_inputs(path: Path) -> dict[str, bool]:
    """MatMul node name -> True when none of its inputs comes out of a DequantizeLinear."""
    model = onnx.load(str(path))
    dq_outputs = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {
        n.name: not any(i in dq_outputs for i in n.input)
        for n in model.graph.node
        if n.op_type == "MatMul"
    }


# (builder, max abs difference, min per-token cosine) against FP32
BUILDS: dict[str, tuple[float, float]] = {
    "graph_optimized": (1e-4, 0.99999),
    "fp16": (2e-2, 0.9999),
    "int8_dynamic": (0.5, 0.97),
    "int8_static": (0.6, 0.95),
    "int4_weight_only": (1.0, 0.9),
}


@pytest.mark.parametrize("kind", list(BUILDS))
def test_variant_loads_runs_and_stays_close(
    kind: str,
    tiny: Path,
    encoder: TextEncoder,
    reader_factory: Callable[[], TextCalibrationReader],
    tmp_path: Path,
) -> None:
    dst = tmp_path / "sub" / f"{kind}.onnx"
    if kind == "int8_static":
        got = variants.int8_static(tiny, dst, reader_factory())
    elif kind == "int4_weight_only":
        got = variants.int4_weight_only(tiny, dst, block_size=16)
    else:
        got = variants.BUILDERS[kind](tiny, dst)
    assert got == dst and dst.is_file()
    assert [p.name for p in dst.parent.iterdir()] == [dst.name]  # no scratch left behind
    ref_session, ref = _run(tiny, encoder)
    session, out = _run(dst, encoder)
    assert _io(session) == _io(ref_session)
    assert out.dtype == np.float32 and out.shape == ref.shape
    max_abs, min_cos = BUILDS[kind]
    assert float(np.abs(out - ref).max()) < max_abs
    assert _min_token_cosine(out, ref) > min_cos
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node}
    expected = {"int8_static": "QuantizeLinear", "int4_weight_only": "MatMulNBits",
                "int8_dynamic": "DynamicQuantizeLinear"}.get(kind)  # fmt: skip
    assert expected is None or expected in ops
    if kind == "fp16":
        inits = onnx.load(str(dst)).graph.initializer
        assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in inits)


def test_graph_optimized_loads_without_optimisation(tiny: Path, tmp_path: Path) -> None:
    dst = variants.graph_optimized(tiny, tmp_path / "opt.onnx")
    opts = session_options(1)
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(str(dst), opts, providers=["CPUExecutionProvider"])


def test_int8_static_keeps_excluded_nodes_float(
    tiny: Path, reader_factory: Callable[[], TextCalibrationReader], tmp_path: Path
) -> None:
    excluded = ["l0/ffn/out/matmul", "l1/attn/scores"]
    dst = variants.int8_static(tiny, tmp_path / "s.onnx", reader_factory(), excluded)
    floats = _float_matmul_inputs(dst)
    assert all(floats[n] for n in excluded)
    assert not any(v for n, v in floats.items() if n not in excluded)


def test_builders_fail_with_variant_error(
    tiny: Path, reader_factory: Callable[[], TextCalibrationReader], tmp_path: Path
) -> None:
    with pytest.raises(variants.VariantError, match="does not exist"):
        variants.fp16(tmp_path / "missing.onnx", tmp_path / "x.onnx")
    with pytest.raises(variants.VariantError, match="no nodes named"):
        variants.int8_static(tiny, tmp_path / "x.onnx", reader_factory(), ["nope"])
    with pytest.raises(variants.VariantError, match="block_size"):
        variants.int4_weight_only(tiny, tmp_path / "x.onnx", block_size=24)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(variants.VariantError, match="graph_optimized"):
        variants.graph_optimized(garbage, tmp_path / "x.onnx")
    assert not (tmp_path / "x.onnx").exists()


def test_calibration_reader_batches_and_rewinds(encoder: TextEncoder) -> None:
    reader = TextCalibrationReader(encoder, TEXTS, batch_size=3)
    batches = list(iter(reader.get_next, None))
    assert len(batches) == len(reader) == 3
    assert [b["input_ids"].shape[0] for b in batches] == [3, 3, 2]
    assert all(b["input_ids"].dtype == np.int64 for b in batches)
    reader.rewind()
    first = reader.get_next()
    assert first is not None and np.array_equal(first["input_ids"], batches[0]["input_ids"])
    with pytest.raises(ValueError):
        TextCalibrationReader(encoder, [], batch_size=3)


def test_node_sensitivity_ranks_every_candidate_once(
    tiny: Path, reader_factory: Callable[[], TextCalibrationReader]
) -> None:
    model = onnx.load(str(tiny))
    matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    ranking = node_sensitivity(tiny, reader_factory)
    names = [n for n, _ in ranking]
    assert sorted(names) == sorted(matmuls)
    scores = [s for _, s in ranking]
    assert scores == sorted(scores, reverse=True)
    assert all(s >= 0 for s in scores) and scores[0] > 0
    some = matmuls[:3]
    assert sorted(n for n, _ in node_sensitivity(tiny, reader_factory, some)) == sorted(some)
    with pytest.raises(ValueError, match="not quantizable"):
        node_sensitivity(tiny, reader_factory, ["nope"])


def test_mixed_precision_excludes_until_the_gate_passes(
    tiny: Path, reader_factory: Callable[[], TextCalibrationReader], tmp_path: Path
) -> None:
    ranking = [(f"l{layer}/{part}", 1.0) for layer in (1, 0)
               for part in ("ffn/out/matmul", "ffn/in/matmul", "attn/context")]  # fmt: skip
    needed = "l0/ffn/in/matmul"  # fifth in the ranking: tries 0, 2, 4 fail, 6 passes

    def passes(path: Path) -> bool:
        return _float_matmul_inputs(path)[needed]

    dst = tmp_path / "mixed.onnx"
    result = mixed_precision(tiny, dst, reader_factory, ranking, passes, max_excluded=6, step=2)
    assert result is not None
    path, excluded = result
    assert path == dst and dst.is_file()
    assert excluded == [n for n, _ in ranking[:6]]
    assert all(_float_matmul_inputs(dst)[n] for n in excluded)

    always = mixed_precision(tiny, dst, reader_factory, ranking, lambda p: True)
    assert always == (dst, [])

    never = mixed_precision(tiny, dst, reader_factory, ranking, lambda p: False, step=3)
    assert never is None and not dst.exists()


def test_builtin_texts_are_varied() -> None:
    for kind in ("calibration", "eval"):
        texts = builtin_texts(kind)
        assert len(texts) >= 50 and all(t == t.strip() and t for t in texts)
        joined = "".join(texts)
        scripts = {
            "latin": any("a" <= c <= "z" for c in joined),
            "cjk": any("\u4e00" <= c <= "\u9fff" for c in joined),
            "kana": any("\u3040" <= c <= "\u30ff" for c in joined),
            "cyrillic": any("\u0400" <= c <= "\u04ff" for c in joined),
            "arabic": any("\u0600" <= c <= "\u06ff" for c in joined),
            "digits": any(c.isdigit() for c in joined),
        }
        assert all(scripts.values()), scripts
        assert max(len(t.split()) for t in texts) > 60  # long inputs are there
        assert min(len(t.split()) for t in texts) <= 2
    assert len(builtin_texts("eval")) > len(builtin_texts("calibration"))
    with pytest.raises(ValueError):
        builtin_texts("train")  # type: ignore[arg-type]


def test_read_texts_txt_and_jsonl(tmp_path: Path) -> None:
    txt = tmp_path / "a.txt"
    txt.write_text("first line\n\n  second  \n", encoding="utf-8")
    assert read_texts(txt) == ["first line", "second"]
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps(r) for r in [{"text": "hello"}, {"text": "日本語", "id": 2}]) + "\n",
        encoding="utf-8",
    )
    assert read_texts(jsonl) == ["hello", "日本語"]
    assert texts_sha256(["a", "b"]) == texts_sha256(["a", "b"]) != texts_sha256(["ab"])


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"\n  \n", "no texts"),
        ("bad.jsonl", b'{"text": "ok"}\n{oops\n', "bad.jsonl:2"),
        ("nofield.jsonl", b'{"body": "x"}\n', '"text" string'),
        ("notobj.jsonl", b'["x"]\n', '"text" string'),
        ("latin1.txt", "caf\u00e9".encode("latin-1"), "not UTF-8"),
    ],
)
def test_read_texts_rejects_bad_files(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_texts(path)
    with pytest.raises(ValueError, match="cannot read"):
        read_texts(tmp_path / "missing.txt")


def test_the_shipped_int8_is_dynamic_when_dynamic_passes_with_its_record(
    tiny: Path, encoder: TextEncoder, tmp_path: Path
) -> None:
    dst = tmp_path / "model.int8.onnx"
    lenient = gated.gated_int8(tiny, dst, encoder, AccuracyGate("cosine", 0.5), TEXTS, TEXTS)
    assert lenient.passed and lenient.method == gated.DYNAMIC and lenient.excluded_nodes == ()
    assert lenient.sha256 == sha256_file(dst) and lenient.file == dst.name
    ops = {n.op_type for n in onnx.load(str(dst)).graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops, ops
    assert lenient.value == lenient.cosine["mean"] >= 0.5
    # Nothing but FP32 itself reaches a cosine above 1: no INT8 passes, nothing is left.
    with pytest.raises(variants.VariantError, match="no set of FP32 nodes makes INT8 pass"):
        gated.gated_int8(tiny, dst, encoder, AccuracyGate("cosine", 1.0001), TEXTS, TEXTS)
    assert not dst.exists()


def test_the_pipeline_names_every_builder_it_has() -> None:
    from tiermesh.optimize.pipeline import BUILDERS, _builders

    assert tuple(_builders(lambda: None)) == BUILDERS  # type: ignore[arg-type,return-value]
