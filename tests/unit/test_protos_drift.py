"""The committed internal stubs are what scripts/gen_protos.py generates from protos/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path("scripts") / "gen_protos.py"


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / SCRIPT), "--check"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_committed_stubs_match_protos() -> None:
    result = _check(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "stubs up to date" in result.stdout


def _copy_tree(dst: Path) -> None:
    shutil.copytree(ROOT / "protos", dst / "protos")
    shutil.copytree(ROOT / "scripts", dst / "scripts")
    stubs = Path("services") / "tiermesh" / "v1"
    shutil.copytree(ROOT / stubs, dst / stubs, ignore=shutil.ignore_patterns("__pycache__"))


def test_check_passes_on_an_unaltered_copy(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    result = _check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_fails_when_a_proto_changes(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    proto = tmp_path / "protos" / "tiermesh" / "v1" / "job.proto"
    text = proto.read_text()
    assert "message Timing {\n" in text
    proto.write_text(
        text.replace("message Timing {\n", "message Timing {\n  int64 drift_probe_ns = 99;\n", 1)
    )
    result = _check(tmp_path)
    assert result.returncode != 0
    assert "drifted" in result.stderr
    assert "job_pb2.py" in result.stderr
    # The committed tree is untouched.
    assert _check(ROOT).returncode == 0
