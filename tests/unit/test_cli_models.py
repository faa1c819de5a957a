"""`tiermesh models build|verify|list` on a repository in a temporary folder (no network)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tiermesh.cli.main import main

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    for name in ("mlp", "minilm-l6"):
        (tmp_path / name).mkdir()
        shutil.copy(MODELS / name / "config.yaml", tmp_path / name / "config.yaml")
    return tmp_path


def test_build_verifies_only_what_it_built(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "build", "--repository", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "mlp: versions ['1'], variants ['fp32'], max_batch_size 32 (sha256 ok)" in out
    assert "minilm" not in out


def test_verify_names_what_is_missing(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["models", "build", "--repository", str(repo)])
    assert main(["models", "verify", "--repository", str(repo)]) == 1
    err = capsys.readouterr().err
    assert "minilm-l6/1/model.onnx is missing" in err
    assert "tiermesh models fetch" in err


def test_a_tampered_file_is_refused(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["models", "build", "--repository", str(repo)])
    shutil.rmtree(repo / "minilm-l6")
    with (repo / "mlp" / "1" / "model.onnx").open("ab") as f:
        f.write(b"\0")
    assert main(["models", "verify", "--repository", str(repo)]) == 1
    assert "sha256 mismatch, refusing to load" in capsys.readouterr().err


def test_list_needs_no_weights(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list", "--repository", str(repo)]) == 0
    out = capsys.readouterr().out
    assert "minilm-l6-ids: versions ['1'], variants ['fp32', 'int8']" in out
