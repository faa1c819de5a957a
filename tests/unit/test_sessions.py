"""Every onnxruntime session the mesh creates has intra-op spinning off (on shared 2-core
machines spinning made identical runs vary 3x for no gain)."""

from __future__ import annotations

import ast
from pathlib import Path

from tiermesh.core.builtin_models import build_mlp
from tiermesh.core.repository import parse_config
from tiermesh.worker.runner import ModelRunner, session_options

SERVICES = Path(__file__).resolve().parents[2] / "services" / "tiermesh"


def test_session_options_turn_spinning_off() -> None:
    opts = session_options(2)
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.intra_op_num_threads == 2


def test_worker_sessions_use_them(tmp_path: Path) -> None:
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
    runner = ModelRunner(cfg, path)
    entry = runner.session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning"
    )
    assert entry == "0"


def test_every_inference_session_in_the_code_gets_session_options() -> None:
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
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "InferenceSession":
                calls.append((source.name, node, bound))
    assert calls, "no InferenceSession found: the scan is broken"
    for name, call, bound in calls:
        args = [*call.args, *(k.value for k in call.keywords)]
        assert any(
            _is_session_options(a) or (isinstance(a, ast.Name) and a.id in bound) for a in args
        ), f"{name}:{call.lineno} creates an InferenceSession without session_options()"


def _is_session_options(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", "") == "session_options"
