"""Variants `tiermesh optimize` writes into a version folder join the model's variants."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tiermesh.core.builtin_models import build_into
from tiermesh.core.repository import ModelRepository, RepositoryError, sha256_file

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "mlp").mkdir()
    shutil.copy(MODELS / "mlp" / "config.yaml", tmp_path / "mlp" / "config.yaml")
    build_into(tmp_path)
    folder = tmp_path / "mlp" / "1"
    shutil.copy(folder / "model.onnx", folder / "model.graph.onnx")
    (folder / "variants.yaml").write_text(yaml.safe_dump({"graph": "model.graph.onnx"}))
    (folder / "provenance.yaml").write_text(
        yaml.safe_dump({"files": {"model.graph.onnx": sha256_file(folder / "model.graph.onnx")}})
    )
    return tmp_path


def test_built_variants_are_served_variants(repo: Path) -> None:
    models = ModelRepository(repo)
    cfg = models.load()["mlp"]
    assert set(cfg.variants) == {"fp32", "graph"}
    assert cfg.default_variant == "fp32"
    assert models.checked_file("mlp", variant="graph").name == "model.graph.onnx"


def test_a_built_variant_is_checked_against_its_provenance(repo: Path) -> None:
    with (repo / "mlp" / "1" / "model.graph.onnx").open("ab") as f:
        f.write(b"\0")
    models = ModelRepository(repo)
    models.load()
    with pytest.raises(RepositoryError, match="sha256 mismatch"):
        models.checked_file("mlp", variant="graph")


def test_a_config_variant_is_not_overridden(repo: Path) -> None:
    (repo / "mlp" / "1" / "variants.yaml").write_text(yaml.safe_dump({"fp32": "other.onnx"}))
    cfg = ModelRepository(repo).load()["mlp"]
    assert cfg.variants["fp32"] == "model.onnx"
    models = ModelRepository(repo)
    models.load()
    assert models.checked_file("mlp").name == "model.onnx"  # other.onnx is not required


def test_a_preoptimized_variant_loads_without_graph_optimisation(repo: Path) -> None:
    import onnxruntime as ort

    from tiermesh.worker.runner import ModelRunner

    prov = repo / "mlp" / "1" / "provenance.yaml"
    data = yaml.safe_load(prov.read_text())
    data["optimize"] = {"graph": {"preoptimized": True}}
    prov.write_text(yaml.safe_dump(data))
    models = ModelRepository(repo)
    cfg = models.load()["mlp"]
    assert models.preoptimized("mlp", "graph") and not models.preoptimized("mlp", "fp32")
    runner = ModelRunner(cfg, models.checked_file("mlp", variant="graph"), preoptimized=True)
    level = runner.session.get_session_options().graph_optimization_level
    assert level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert runner.load_s > 0
