"""Every onnxruntime session the mesh creates comes from the session factory
(core/sessions.py), with intra-op spinning off (on shared 2-core machines spinning made
identical runs vary 3x for no gain). Execution providers: test_execution_providers.py."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.jobs import Job
from tiermesh.core.repository import parse_config
from tiermesh.core.sessions import session_options
from tiermesh.core.tensors import from_numpy, to_numpy
from tiermesh.worker import runner as runner_module
from tiermesh.worker.runner import ModelRunner

SERVICES = Path(__file__).resolve().parents[2] / "services" / "tiermesh"


def test_session_options_turn_spinning_off() -> None:
    opts = session_options(2)
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.intra_op_num_threads == 2


def mlp_runner(tmp_path: Path, **kwargs: Any) -> ModelRunner:
    path = tmp_path / "model.onnx"
    path.write_bytes(build_mlp())
    cfg = parse_config(
        {
            "name": "mlp",
            "max_batch_size": 4,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [3]}],
            "versions": {"1": {"model.onnx": "x"}},
        },
        "test",
    )
    return ModelRunner(cfg, path, **kwargs)


def test_worker_sessions_use_them(tmp_path: Path) -> None:
    runner = mlp_runner(tmp_path)
    entry = runner.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning"
    )
    assert entry == "0"


def test_only_the_factory_creates_sessions_or_names_a_provider() -> None:
    """InferenceSession and the CPU provider's name appear in core/sessions.py alone (text,
    not the syntax tree: the optimize tools run scripts from strings too)."""
    seen = []
    for source in SERVICES.rglob("*.py"):
        if "v1" in source.parts:
            continue
        text = source.read_text()
        for needle in ("InferenceSession(", '"CPUExecutionProvider"'):
            if needle in text:
                seen.append((source.relative_to(SERVICES).as_posix(), needle))
    assert sorted(seen) == [
        ("core/sessions.py", '"CPUExecutionProvider"'),
        ("core/sessions.py", "InferenceSession("),
    ]


def test_every_session_the_code_opens_gets_session_options() -> None:
    calls = []
    for source in SERVICES.rglob("*.py"):
        if "v1" in source.parts:
            continue
        tree = ast.parse(source.read_text())
        # Names bound to session_options(...) in this module (options tweaked, then passed).
        bound = {
            t.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and _is_session_options(node.value)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) == "open_session":
                calls.append((source.name, node, bound))
    assert len(calls) >= 6, "open_session calls not found: the scan is broken"
    for name, call, bound in calls:
        options = call.args[1] if len(call.args) > 1 else None
        assert options is not None and (
            _is_session_options(options) or (isinstance(options, ast.Name) and options.id in bound)
        ), f"{name}:{call.lineno} opens a session without session_options()"


def _called(node: ast.Call) -> str:
    return str(getattr(node.func, "id", "") or getattr(node.func, "attr", ""))


def _is_session_options(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and _called(node) == "session_options"


def test_a_small_model_gets_a_wide_session_for_batches_computing_alone(tmp_path: Path) -> None:
    runner = mlp_runner(tmp_path, intra_op_threads=1, wide_threads=2)
    assert runner.wide is not None
    assert runner.wide.get_session_options().intra_op_num_threads == 2
    assert runner.session.get_session_options().intra_op_num_threads == 1
    x = from_numpy("INPUT0", np.arange(8, dtype=np.float32).reshape(2, 4), "FP32")
    job = Job(request_id="r", model="mlp", inputs=(x,), gateway="g")
    narrow, wide = runner.run([job]), runner.run([job], alone=True)
    np.testing.assert_array_equal(to_numpy(wide[0].outputs[0]), to_numpy(narrow[0].outputs[0]))


def test_no_wide_session_for_a_large_model_or_one_lane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert mlp_runner(tmp_path, intra_op_threads=2, wide_threads=2).wide is None
    assert mlp_runner(tmp_path, intra_op_threads=0, wide_threads=2).wide is None
    monkeypatch.setattr(runner_module, "WIDE_MAX_BYTES", 100)  # the mlp is larger
    assert mlp_runner(tmp_path, intra_op_threads=1, wide_threads=2).wide is None
