"""Model integrity: nothing reaches an onnxruntime session unless it matched its sha256,
stayed inside the repository, and (ONNX external data) inside the model's own folder."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from tiermesh.core.builtin_models import IR_VERSION, OPSET, build_echo, build_mlp
from tiermesh.core.repository import ModelRepository, RepositoryError
from tiermesh.core.settings import WorkerSettings
from tiermesh.core.telemetry import Telemetry
from tiermesh.worker.__main__ import serve as serve_worker
from tiermesh.worker.runner import ModelRunner

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 7


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _config(name: str, files: dict[str, str], model_file: str = "model.onnx") -> dict[str, Any]:
    return {
        "name": name,
        "max_batch_size": 8,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3]}],
        "model_file": model_file,
        "versions": {"1": files},
    }


def _write_config(root: Path, name: str, config: dict[str, Any]) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.yaml").write_text(yaml.safe_dump(config))


def _mlp_repo(root: Path) -> Path:
    """A repository with the built-in mlp (weights inside the file)."""
    data = build_mlp()
    _write_config(root, "mlp", _config("mlp", {"model.onnx": _sha(data)}))
    (root / "mlp" / "1").mkdir()
    (root / "mlp" / "1" / "model.onnx").write_bytes(data)
    return root / "mlp" / "1" / "model.onnx"


def _external_model(location: str) -> bytes:
    """OUTPUT0 = INPUT0 @ W with W in external data at `location` (no bytes inside)."""
    weights = numpy_helper.from_array(WEIGHTS, "w")
    weights.ClearField("raw_data")
    weights.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "48")):
        weights.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "w"], ["OUTPUT0"])],
        "ext",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[weights],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return bytes(model.SerializeToString())


def _external_repo(root: Path, location: str = "weights.bin", record: bool = True) -> Path:
    """A model whose weights live in `location`, written where that location points (when
    it is relative to the version folder) and, when `record`, listed with its sha256."""
    folder = root / "ext" / "1"
    folder.mkdir(parents=True)
    model = _external_model(location)
    (folder / "model.onnx").write_bytes(model)
    target = Path(os.path.normpath(folder / location))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(WEIGHTS.tobytes())
    files = {"model.onnx": _sha(model)}
    if record:
        files[location] = _sha(WEIGHTS.tobytes())
    _write_config(root, "ext", _config("ext", files))
    return folder


def _loaded(root: Path) -> ModelRepository:
    repo = ModelRepository(root)
    repo.load()
    return repo


X = np.array([[1, 2, 3, 4], [-1, 0.5, 0, 2]], dtype=np.float32)


def _mlp_reference() -> np.ndarray:
    sess = ort.InferenceSession(build_mlp(), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(["OUTPUT0"], {"INPUT0": X})[0])


def _run(runner: ModelRunner) -> np.ndarray:
    return np.asarray(runner.session.run(["OUTPUT0"], {"INPUT0": X})[0])


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every onnxruntime session the runner module creates (what it was created from)."""
    created: list[Any] = []
    real = ort.InferenceSession

    def spy(source: Any, *args: Any, **kwargs: Any) -> Any:
        created.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", spy)  # what the runner module calls
    return created


# -- sha256, and when it is checked ------------------------------------------------------------


def _tamper(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"\0")


def _worker_settings(root: Path, models: str) -> WorkerSettings:
    # Models load before the worker connects to anything: no redis is needed to see a refusal.
    return WorkerSettings(
        model_repository=root,
        worker_models=models,
        redis_url="redis://127.0.0.1:1/0",
        worker_health_port=0,
        metrics_port=0,
    )


async def test_worker_refuses_a_model_tampered_before_it_starts(
    tmp_path: Path, sessions: list[Any]
) -> None:
    model = _mlp_repo(tmp_path)
    _tamper(model)
    with pytest.raises(RepositoryError) as exc:
        await serve_worker(_worker_settings(tmp_path, "mlp"), asyncio.Event(), Telemetry("w"))
    assert "sha256 mismatch, refusing to load" in str(exc.value)
    assert str(model) in str(exc.value)
    assert sessions == []


async def test_worker_refuses_a_model_tampered_after_the_repository_loaded(
    tmp_path: Path, sessions: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configs were read (and the file was intact then); the file changes before the
    worker creates its session: the session is refused, none is created."""
    model = _mlp_repo(tmp_path)
    real_load = ModelRepository.load

    def load_then_tamper(self: ModelRepository) -> Any:
        configs = real_load(self)
        assert self.checked_file("mlp") == model  # intact when the repository loaded
        _tamper(model)
        return configs

    monkeypatch.setattr(ModelRepository, "load", load_then_tamper)
    with pytest.raises(RepositoryError) as exc:
        await serve_worker(_worker_settings(tmp_path, "mlp"), asyncio.Event(), Telemetry("w"))
    assert "sha256 mismatch, refusing to load" in str(exc.value)
    assert sessions == []


def test_session_is_built_from_the_bytes_that_were_checked(
    tmp_path: Path, sessions: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file swapped between the check and the session cannot reach the session: the
    session is created from the verified bytes, never from the path."""
    model = _mlp_repo(tmp_path)
    repo = _loaded(tmp_path)
    verified = repo.verified_model("mlp")
    model.write_bytes(build_echo())  # swapped for another (valid) model after the check
    runner = ModelRunner(repo.configs["mlp"], verified)
    assert sessions == [build_mlp()]
    np.testing.assert_allclose(_run(runner), _mlp_reference(), rtol=1e-6)


def test_a_verified_model_is_shown_by_its_path_never_its_bytes(tmp_path: Path) -> None:
    """Its repr (in logs, errors, str()) names the file; a model's bytes escaped cost seconds
    and gigabytes: building sessions from str(model) once made smollm2 load in 15 s, not 2."""
    _mlp_repo(tmp_path)
    verified = _loaded(tmp_path).verified_model("mlp")
    assert str(verified) == f"VerifiedModel(path={verified.path!r})"


def test_verified_model_checks_every_file_of_the_version(tmp_path: Path) -> None:
    _mlp_repo(tmp_path)
    config = yaml.safe_load((tmp_path / "mlp" / "config.yaml").read_text())
    config["versions"]["1"]["notes.txt"] = _sha(b"notes")
    (tmp_path / "mlp" / "config.yaml").write_text(yaml.safe_dump(config))
    (tmp_path / "mlp" / "1" / "notes.txt").write_bytes(b"edited notes")
    with pytest.raises(RepositoryError, match=r"notes\.txt: sha256 mismatch"):
        _loaded(tmp_path).verified_model("mlp")


# -- ONNX external data ------------------------------------------------------------------------


def test_external_data_inside_the_folder_is_verified_and_served_from_memory(
    tmp_path: Path, sessions: list[Any]
) -> None:
    folder = _external_repo(tmp_path)
    repo = _loaded(tmp_path)
    verified = repo.verified_model("ext")
    assert verified.external == {"weights.bin": WEIGHTS.tobytes()}
    shutil.rmtree(folder)  # onnxruntime reads nothing from disk: only the verified bytes
    runner = ModelRunner(repo.configs["ext"], verified)
    np.testing.assert_allclose(_run(runner), X @ WEIGHTS, rtol=1e-6)
    assert len(sessions) == 1 and isinstance(sessions[0], bytes)


def test_tampered_external_data_is_refused(tmp_path: Path) -> None:
    folder = _external_repo(tmp_path)
    (folder / "weights.bin").write_bytes((WEIGHTS * 2).tobytes())
    with pytest.raises(RepositoryError, match=r"weights\.bin: sha256 mismatch"):
        _loaded(tmp_path).verified_model("ext")


def test_external_data_without_a_recorded_sha256_is_refused(tmp_path: Path) -> None:
    _external_repo(tmp_path, record=False)
    with pytest.raises(RepositoryError, match=r"'weights\.bin' has no recorded sha256"):
        _loaded(tmp_path).verified_model("ext")


@pytest.mark.parametrize(
    "location", ["../outside.bin", "sub/../../outside.bin", "./../1/../../x.bin", "a\\..\\b"]
)
def test_external_data_climbing_out_of_the_folder_is_refused(
    tmp_path: Path, location: str, sessions: list[Any]
) -> None:
    _external_repo(tmp_path, location, record=False)
    with pytest.raises(RepositoryError, match=r"external data: file name .* must be a relative"):
        _loaded(tmp_path).verified_model("ext")
    assert sessions == []
    # Listed in the config with its sha256, the name is refused there already.
    shutil.rmtree(tmp_path / "ext")
    _external_repo(tmp_path, location)
    with pytest.raises(RepositoryError, match="relative path inside the folder"):
        _loaded(tmp_path).verified_model("ext")


def test_external_data_at_an_absolute_path_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "weights.bin"
    _external_repo(tmp_path / "repo", str(outside), record=False)
    with pytest.raises(RepositoryError, match="relative path inside the folder"):
        _loaded(tmp_path / "repo").verified_model("ext")


def test_external_data_through_a_symlinked_folder_is_refused(tmp_path: Path) -> None:
    """`link/weights.bin` looks relative, but `link` leads out of the model's folder (here
    to another model's folder, inside the repository): refused all the same."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "weights.bin").write_bytes(WEIGHTS.tobytes())
    folder = tmp_path / "ext" / "1"
    folder.mkdir(parents=True)
    (folder / "link").symlink_to(other, target_is_directory=True)
    model = _external_model("link/weights.bin")
    (folder / "model.onnx").write_bytes(model)
    files = {"model.onnx": _sha(model)}
    _write_config(tmp_path, "ext", _config("ext", files))
    with pytest.raises(RepositoryError, match="outside the model's folder"):
        _loaded(tmp_path).verified_model("ext")


def test_external_data_location_is_found_in_subgraphs(tmp_path: Path) -> None:
    """An If node's branch holding the external tensor is checked like the main graph."""
    inner = onnx.load_model_from_string(_external_model("../x.bin")).graph
    branch = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "w"], ["y"])],
        "branch",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        initializer=list(inner.initializer),
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["OUTPUT0"], then_branch=branch, else_branch=branch)],
        "sub",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    raw = data.SerializeToString()
    folder = tmp_path / "ext" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(raw)
    _write_config(tmp_path, "ext", _config("ext", {"model.onnx": _sha(raw)}))
    with pytest.raises(RepositoryError, match=r"external data: file name '\.\./x\.bin'"):
        _loaded(tmp_path).verified_model("ext")


# -- symlinks and names that lead out of the repository ---------------------------------------


def _link_setup(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """(repository root, a folder outside it holding a real mlp, the mlp bytes)."""
    data = build_mlp()
    root = tmp_path / "repo"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.onnx").write_bytes(data)
    _write_config(root, "mlp", _config("mlp", {"model.onnx": _sha(data)}))
    return root, outside, data


Setup = Callable[[Path, Path], None]


def _file_link(root: Path, outside: Path) -> None:
    (root / "mlp" / "1").mkdir()
    (root / "mlp" / "1" / "model.onnx").symlink_to(outside / "model.onnx")


def _version_link(root: Path, outside: Path) -> None:
    (root / "mlp" / "1").symlink_to(outside, target_is_directory=True)


def _model_link(root: Path, outside: Path) -> None:
    (outside / "1").mkdir()
    shutil.move(outside / "model.onnx", outside / "1" / "model.onnx")
    shutil.move(root / "mlp" / "config.yaml", outside / "config.yaml")
    (root / "mlp").rmdir()
    (root / "mlp").symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("setup", [_file_link, _version_link, _model_link])
def test_symlinks_leading_out_of_the_repository_are_refused(
    tmp_path: Path, setup: Setup, sessions: list[Any]
) -> None:
    """Even with the right sha256: the bytes are not the repository's to vouch for."""
    root, outside, _ = _link_setup(tmp_path)
    setup(root, outside)
    repo = _loaded(root)
    for check in (repo.verified_model, repo.checked_folder, repo.checked_file):
        with pytest.raises(RepositoryError, match="outside the model repository"):
            check("mlp")
    assert sessions == []


def test_a_symlink_inside_the_repository_is_fine(tmp_path: Path) -> None:
    root, _, data = _link_setup(tmp_path)
    shared = root / "shared"
    shared.mkdir()
    (shared / "mlp.onnx").write_bytes(data)
    (root / "mlp" / "1").mkdir()
    (root / "mlp" / "1" / "model.onnx").symlink_to(Path("../../shared/mlp.onnx"))
    assert _loaded(root).verified_model("mlp").data == data


@pytest.mark.parametrize("file", ["../model.onnx", "/tmp/model.onnx", "a/../../b.onnx"])
def test_config_file_names_that_climb_out_are_refused(tmp_path: Path, file: str) -> None:
    data = build_mlp()
    _write_config(tmp_path, "mlp", _config("mlp", {file: _sha(data)}, model_file=file))
    with pytest.raises(RepositoryError, match="relative path inside the folder"):
        _loaded(tmp_path).verified_model("mlp")


def test_a_version_that_climbs_out_is_refused(tmp_path: Path) -> None:
    data = build_mlp()
    config = _config("mlp", {})
    config["versions"] = {"..": {"model.onnx": _sha(data)}}
    _write_config(tmp_path, "mlp", config)
    (tmp_path / "model.onnx").write_bytes(data)
    # Refused when the config is read: a version name is part of a compute unit's name.
    with pytest.raises(RepositoryError, match="version names must match"):
        _loaded(tmp_path).checked_folder("mlp", "..")


def test_provenance_file_leading_out_of_the_repository_is_refused(tmp_path: Path) -> None:
    """provenance.yaml holds the checksums of files built here: it must be the repository's."""
    root, outside, data = _link_setup(tmp_path)
    _write_config(root, "mlp", _config("mlp", {"model.onnx": "provenance"}))
    (root / "mlp" / "1").mkdir()
    (root / "mlp" / "1" / "model.onnx").write_bytes(data)
    (outside / "provenance.yaml").write_text(yaml.safe_dump({"files": {"model.onnx": _sha(data)}}))
    (root / "mlp" / "1" / "provenance.yaml").symlink_to(outside / "provenance.yaml")
    with pytest.raises(RepositoryError, match="outside the model repository"):
        _loaded(root).verified_model("mlp")
