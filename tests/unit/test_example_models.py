"""Triton's example models as the repository builds them (core/example_models.py): the bytes
are reproducible and match the sha256 in models/<name>/config.yaml, the configs have Triton's
tensor names and shapes, and the graphs compute what Triton's example clients check."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from tiermesh.core.builtin_models import BUILDERS, build_into
from tiermesh.core.repository import ModelRepository

MODELS = Path(__file__).resolve().parents[2] / "models"
EXAMPLES = ("simple", "simple_string", "simple_identity")


def _session(model: bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_bytes_match_committed_sha256(name: str) -> None:
    committed = yaml.safe_load((MODELS / name / "config.yaml").read_text())["versions"]["1"]
    first, second = BUILDERS[name](), BUILDERS[name]()
    assert first == second
    assert hashlib.sha256(first).hexdigest() == committed["model.onnx"]


def test_models_build_writes_simple_identity(tmp_path: Path) -> None:
    (tmp_path / "simple_identity").mkdir()
    config = (MODELS / "simple_identity" / "config.yaml").read_text()
    (tmp_path / "simple_identity" / "config.yaml").write_text(config)
    (written,) = build_into(tmp_path)
    assert written == tmp_path / "simple_identity" / "1" / "model.onnx"
    repo = ModelRepository(tmp_path)
    cfg = repo.load()["simple_identity"]
    assert repo.checked_file("simple_identity").read_bytes() == BUILDERS["simple_identity"]()
    # Triton's docs/examples/model_repository/simple_identity: one BYTES tensor in and out,
    # any length, batches of up to 8.
    assert cfg.max_batch_size == 8
    assert [(t.name, t.datatype, t.dims) for t in cfg.inputs] == [("INPUT0", "BYTES", (-1,))]
    assert [(t.name, t.datatype, t.dims) for t in cfg.outputs] == [("OUTPUT0", "BYTES", (-1,))]


def test_simple_identity_returns_every_element_unchanged() -> None:
    rows = np.array(
        [["he\x00llo", "", "\x00\x01\x02\x03"], ["héllo", "日本", "x" * 300]], dtype=object
    )
    (got,) = _session(BUILDERS["simple_identity"]()).run(["OUTPUT0"], {"INPUT0": rows})
    assert got.tolist() == rows.tolist()


def test_simple_and_simple_string_add_and_subtract() -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), -3, dtype=np.int32)
    total, difference = _session(BUILDERS["simple"]()).run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(difference, a - b)

    def text(x: np.ndarray) -> np.ndarray:
        return np.array([[str(v) for v in row] for row in x], dtype=object)

    session = _session(BUILDERS["simple_string"]())
    total, difference = session.run(None, {"INPUT0": text(a), "INPUT1": text(b)})
    assert total.tolist() == text(a + b).tolist()
    assert difference.tolist() == text(a - b).tolist()
