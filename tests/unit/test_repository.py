"""The model repository (configs, checksums) and the byte-reproducible built-in models."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import numpy_helper

from tiermesh.core.builtin_models import build_echo, build_into, build_mlp
from tiermesh.core.repository import ModelRepository, RepositoryError, parse_config
from tiermesh.core.tensors import DATATYPES

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"

PAYLOAD = b"not really onnx, only bytes to hash"
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


def _raw(name: str = "tiny", **over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": name,
        "max_batch_size": 4,
        "inputs": [{"name": "X", "datatype": "FP32", "dims": [2]}],
        "outputs": [{"name": "Y", "datatype": "FP32", "dims": [-1]}],
        "batching": {"max_batch_wait_ms": 3},
        "priority_levels": 3,
        "default_priority": 1,
        "length_buckets": [8, 32],
        "versions": {"1": {"model.onnx": DIGEST}},
    }
    raw.update(over)
    return raw


def _write(root: Path, folder: str, config: dict[str, Any] | str) -> Path:
    path = root / folder / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    return path


def _weights(root: Path, name: str, data: bytes = PAYLOAD, version: str = "1") -> Path:
    path = root / name / version / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


# -- loading -------------------------------------------------------------------------------


def test_load_and_checked_file(tmp_path: Path) -> None:
    _write(tmp_path, "tiny", _raw())
    _write(tmp_path, "other", _raw("other", versions={"1": {"model.onnx": DIGEST}}))
    model = _weights(tmp_path, "tiny")
    repo = ModelRepository(tmp_path)
    configs = repo.load()
    assert sorted(configs) == ["other", "tiny"]
    cfg = configs["tiny"]
    assert (cfg.max_batch_size, cfg.max_batch_wait_ms, cfg.priority_levels) == (4, 3.0, 3)
    assert cfg.default_priority == 1
    assert cfg.length_buckets == (8, 32)
    assert cfg.bucket_count == 2
    assert cfg.input("X") is not None and cfg.input("X").dims == (2,)  # type: ignore[union-attr]
    assert repo.get("tiny") is cfg
    assert repo.get("nope") is None
    assert repo.checked_file("tiny") == model
    assert repo.checked_file("tiny", "1") == model


def test_latest_version_is_numeric_max(tmp_path: Path) -> None:
    _write(
        tmp_path, "tiny", _raw(versions={"2": {"model.onnx": DIGEST}, "10": {"model.onnx": DIGEST}})
    )
    _weights(tmp_path, "tiny", version="10")
    repo = ModelRepository(tmp_path)
    repo.load()
    assert repo.configs["tiny"].latest.version == "10"
    assert repo.checked_file("tiny") == tmp_path / "tiny" / "10" / "model.onnx"


def test_sha256_mismatch_refuses(tmp_path: Path) -> None:
    _write(tmp_path, "tiny", _raw())
    path = _weights(tmp_path, "tiny", data=PAYLOAD + b"!")
    repo = ModelRepository(tmp_path)
    repo.load()
    with pytest.raises(RepositoryError) as exc:
        repo.checked_file("tiny")
    msg = str(exc.value)
    assert "sha256 mismatch" in msg
    assert DIGEST in msg
    assert hashlib.sha256(PAYLOAD + b"!").hexdigest() in msg
    assert str(path) in msg


def test_missing_file_says_how_to_build(tmp_path: Path) -> None:
    _write(tmp_path, "tiny", _raw())
    repo = ModelRepository(tmp_path)
    repo.load()
    with pytest.raises(RepositoryError) as exc:
        repo.checked_file("tiny")
    assert "tiermesh models build" in str(exc.value)
    assert str(tmp_path / "tiny" / "1" / "model.onnx") in str(exc.value)


@pytest.mark.parametrize(("name", "version"), [("nope", ""), ("tiny", "9")])
def test_checked_file_unknown(tmp_path: Path, name: str, version: str) -> None:
    _write(tmp_path, "tiny", _raw())
    repo = ModelRepository(tmp_path)
    repo.load()
    with pytest.raises(RepositoryError):
        repo.checked_file(name, version)


def test_missing_repository(tmp_path: Path) -> None:
    with pytest.raises(RepositoryError, match="does not exist"):
        ModelRepository(tmp_path / "absent").load()


# -- malformed configs ---------------------------------------------------------------------


def test_bad_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, "tiny", "name: tiny\ninputs: [unclosed\n")
    with pytest.raises(RepositoryError, match="not valid YAML") as exc:
        ModelRepository(tmp_path).load()
    assert str(path) in str(exc.value)


def test_name_must_match_folder(tmp_path: Path) -> None:
    _write(tmp_path, "folder", _raw("tiny"))
    with pytest.raises(RepositoryError, match=r"name 'tiny' != folder 'folder'"):
        ModelRepository(tmp_path).load()


def _inputs(**entry: Any) -> list[dict[str, Any]]:
    return [{"name": "X", "datatype": "FP32", "dims": [2], **entry}]


@pytest.mark.parametrize(
    ("over", "text"),
    [
        ({"inputs": _inputs(datatype="FLOAT")}, "unknown datatype 'FLOAT'"),
        ({"outputs": _inputs(datatype="STRING")}, "unknown datatype 'STRING'"),
        ({"inputs": _inputs(dims=[0])}, "must be positive or -1"),
        ({"inputs": _inputs(dims=[-2])}, "must be positive or -1"),
        ({"inputs": [{"name": "X", "dims": [2]}]}, "inputs.0.datatype: missing required key"),
        ({"inputs": []}, "inputs: List should have at least 1 item"),
        ({"outputs": None}, "outputs: Input should be a valid list"),
        ({"default_priority": -1}, "default_priority must be in 1..priority_levels"),
        ({"default_priority": 4}, "default_priority must be in 1..priority_levels"),
        ({"priority_levels": 0, "default_priority": 0}, "out of range"),
        ({"max_batch_size": -1}, "out of range"),
        ({"queue_bound": 0}, "out of range"),
        ({"versions": {}}, "no versions"),
        ({"max_batch_size": "many"}, "max_batch_size: Input should be a valid integer"),
    ],
)
def test_malformed_config(tmp_path: Path, over: dict[str, Any], text: str) -> None:
    _write(tmp_path, "tiny", _raw(**over))
    with pytest.raises(RepositoryError) as exc:
        ModelRepository(tmp_path).load()
    assert text in str(exc.value)
    assert str(tmp_path / "tiny" / "config.yaml") in str(exc.value)


@pytest.mark.parametrize(("over", "level"), [({"default_priority": 0}, 3), ({}, 1)])
def test_default_priority_zero_means_lowest(over: dict[str, Any], level: int) -> None:
    assert parse_config(_raw(**over), "w").default_priority == level


@pytest.mark.parametrize("key", ["name", "versions"])
def test_missing_required_key(key: str) -> None:
    raw = _raw()
    del raw[key]
    with pytest.raises(RepositoryError, match=f"{key}: missing required key"):
        parse_config(raw, "w")


def test_not_a_mapping() -> None:
    with pytest.raises(RepositoryError, match="expected a mapping"):
        parse_config(["name", "tiny"], "w")


# Known bugs in services/tiermesh/core/repository.py (see the report); these fail until fixed.


@pytest.mark.parametrize(
    "over",
    [{"versions": {"1": ["model.onnx"]}}, {"batching": [2]}],
    ids=["files-as-list", "batching-as-list"],
)
def test_wrongly_shaped_section_is_repository_error(over: dict[str, Any]) -> None:
    with pytest.raises(RepositoryError):
        parse_config(_raw(**over), "w")


@pytest.mark.parametrize("buckets", [[64, 16], [16, 16], [0, 8]])
def test_length_buckets_must_be_positive_and_ascending(buckets: list[int]) -> None:
    with pytest.raises(RepositoryError):
        parse_config(_raw(length_buckets=buckets), "w")


def test_model_file_without_checksum_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "tiny", _raw(versions={"1": {"tokenizer.json": DIGEST}}))
    (_weights(tmp_path, "tiny").parent / "tokenizer.json").write_bytes(PAYLOAD)
    _weights(tmp_path, "tiny", data=b"anything at all")  # model.onnx, never hashed
    repo = ModelRepository(tmp_path)
    with pytest.raises(RepositoryError):
        repo.load()
        repo.checked_file("tiny")


# -- built-in models -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "builder"), [("mlp", build_mlp), ("echo", build_echo)])
def test_builtin_bytes_match_committed_sha256(name: str, builder: Any) -> None:
    config = yaml.safe_load((MODELS / name / "config.yaml").read_text())
    committed = config["versions"]["1"]["model.onnx"]
    first, second = builder(), builder()
    assert first == second
    assert hashlib.sha256(first).hexdigest() == committed


def test_committed_configs_parse() -> None:
    repo = ModelRepository(MODELS)
    configs = repo.load()
    assert {"mlp", "echo"} <= set(configs)
    assert all(t.datatype in DATATYPES for c in configs.values() for t in c.inputs)


def test_build_into_writes_checked_files(tmp_path: Path) -> None:
    for name in ("mlp", "echo"):
        _write(tmp_path, name, (MODELS / name / "config.yaml").read_text())
    written = build_into(tmp_path)
    assert sorted(p.parent.parent.name for p in written) == ["echo", "mlp"]
    repo = ModelRepository(tmp_path)
    repo.load()
    assert repo.checked_file("mlp").read_bytes() == build_mlp()
    assert repo.checked_file("echo").read_bytes() == build_echo()


def _session(model: bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def test_mlp_matches_numpy() -> None:
    model_bytes = build_mlp()
    weights = {
        init.name: numpy_helper.to_array(init)
        for init in onnx.load_from_string(model_bytes).graph.initializer
    }
    assert weights["w1"].shape == (4, 16)
    assert weights["w2"].shape == (16, 3)
    x = np.random.default_rng(7).standard_normal((5, 4)).astype(np.float32)
    (got,) = _session(model_bytes).run(["OUTPUT0"], {"INPUT0": x})
    hidden = np.maximum(x @ weights["w1"] + weights["b1"], 0.0)
    want = hidden @ weights["w2"] + weights["b2"]
    assert got.shape == (5, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, 0.0)


def test_echo_returns_text() -> None:
    text = np.array([["héllo", "日本"], ["", "x"]], dtype=object)
    (got,) = _session(build_echo()).run(["ECHO"], {"TEXT": text})
    assert got.tolist() == text.tolist()
