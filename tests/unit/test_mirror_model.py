"""A one-model repository made from a committed model (benchmarks, tests): the config as
written or as edited, every version folder mirrored (large files linked, not copied), and a
repository the server accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiermesh.core.model_files import LINK_ABOVE_BYTES, mirror_model
from tiermesh.core.repository import ModelRepository

MODELS = Path(__file__).resolve().parents[2] / "models"


def test_the_config_is_copied_byte_for_byte_without_an_edit(tmp_path: Path) -> None:
    root = mirror_model(MODELS / "mlp", tmp_path / "repo")
    assert root == tmp_path / "repo"
    src, dest = MODELS / "mlp", root / "mlp"
    assert (dest / "config.yaml").read_bytes() == (src / "config.yaml").read_bytes()
    versions = sorted(p.name for p in src.iterdir() if p.is_dir())
    assert sorted(p.name for p in dest.iterdir() if p.is_dir()) == versions
    for version in versions:
        names = sorted(p.name for p in (src / version).iterdir() if p.is_file())
        assert sorted(p.name for p in (dest / version).iterdir()) == names


def test_an_edit_changes_the_parsed_config_and_the_repository_loads(tmp_path: Path) -> None:
    def bigger_batches(raw: dict[str, Any]) -> None:
        raw["max_batch_size"] = 7

    root = mirror_model(MODELS / "mlp", tmp_path / "repo", bigger_batches)
    raw = yaml.safe_load((root / "mlp" / "config.yaml").read_text())
    assert raw["max_batch_size"] == 7
    repo = ModelRepository(root)
    assert repo.load()["mlp"].max_batch_size == 7
    assert repo.checked_folder("mlp").parent == root / "mlp"  # every checksum still holds


def test_large_files_are_linked_small_ones_copied(tmp_path: Path) -> None:
    src = tmp_path / "src" / "m"
    (src / "1").mkdir(parents=True)
    (src / "config.yaml").write_text("name: m\n")
    (src / "1" / "big.bin").write_bytes(b"x" * (LINK_ABOVE_BYTES + 1))
    (src / "1" / "small.txt").write_text("hi")
    (src / "notes").mkdir()  # not a version folder: left out
    root = mirror_model(src, tmp_path / "repo")
    big, small = root / "m" / "1" / "big.bin", root / "m" / "1" / "small.txt"
    assert big.stat().st_ino == (src / "1" / "big.bin").stat().st_ino
    assert small.stat().st_ino != (src / "1" / "small.txt").stat().st_ino
    assert small.read_text() == "hi"
    assert not (root / "m" / "notes").exists()
