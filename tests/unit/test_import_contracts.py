"""The import rule of pyproject.toml's [tool.importlinter] holds on the tree, and breaking it
fails `lint-imports` by the contract broken.

`lint-imports` runs as `make lint` runs it, in a process of its own: it imports the package
to find it, so PYTHONPATH names the tree checked (this one's `services`, or a copy).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
# The console script's entry point; importlinter.cli has no `__main__` of its own.
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())"


def contract_names() -> dict[str, str]:
    with PYPROJECT.open("rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return {c["id"]: c["name"] for c in contracts}


def lint_imports(cwd: Path, services: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the package under `services`, with the contracts of `cwd`'s
    pyproject.toml; no cache, so nothing is written into the tree."""
    env = {**os.environ, "PYTHONPATH": str(services), "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_every_contract() -> None:
    run = lint_imports(ROOT, ROOT / "services")
    assert run.returncode == 0, run.stdout + run.stderr
    for name in contract_names().values():
        assert f"{name} KEPT" in run.stdout


def test_a_service_importing_another_service_or_a_tool_breaks_the_rule(tmp_path: Path) -> None:
    services = tmp_path / "services"
    shutil.copytree(
        ROOT / "services" / "tiermesh",
        services / "tiermesh",
        ignore=shutil.ignore_patterns("__pycache__", "go", "goload"),
    )
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    with (services / "tiermesh" / "gateway" / "servicer.py").open("a") as f:
        f.write("\nimport tiermesh.router.policy  # noqa: E402\n")
    with (services / "tiermesh" / "worker" / "loop.py").open("a") as f:
        f.write("\nimport tiermesh.convert.fetch  # noqa: E402\n")

    run = lint_imports(tmp_path, services)

    assert run.returncode != 0, run.stdout + run.stderr
    names = contract_names()
    for broken in ("services-independent", "no-tools-in-services", "layers"):
        assert f"{names[broken]} BROKEN" in run.stdout
    assert "tiermesh.gateway.servicer -> tiermesh.router.policy" in run.stdout
    assert "tiermesh.worker.loop -> tiermesh.convert.fetch" in run.stdout
