"""`tiermesh infer` against the running mesh prints the model's answer as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.e2e.conftest import UpProcess
from tests.e2e.test_requests_e2e import reference

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiermesh.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_infer_prints_outputs_and_timings(mesh_up: UpProcess) -> None:
    done = run_cli("infer", "--url", mesh_up.url, "--model", "mlp", "--data", "[[1, 2, 3, 4]]")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    want = reference(mesh_up, np.array([[1, 2, 3, 4]], dtype=np.float32))
    np.testing.assert_allclose(answer["outputs"]["OUTPUT0"], want, rtol=1e-6)
    assert int(answer["parameters"]["tiermesh.compute_ms"]) >= 0


def test_infer_text(mesh_up: UpProcess) -> None:
    done = run_cli("infer", "--url", mesh_up.url, "--model", "echo", "--text", "hi there")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["outputs"]["ECHO"] == [["hi there"]]
