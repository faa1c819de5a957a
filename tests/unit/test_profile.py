"""`tiermesh profile` on a tiny graph built here, and the CLI once on the built-in mlp."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiermesh.cli.main import main
from tiermesh.core.builtin_models import build_into
from tiermesh.optimize import profile as prof

MODELS = Path(__file__).resolve().parents[2] / "models"
SEQ = 16


@pytest.fixture
def tiny() -> onnx.ModelProto:
    """x[batch, seq, 4] @ W[4, 8] + b -> Relu -> h; scores = Softmax(h @ h^T)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "B")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"], name="proj"),
        helper.make_node("Add", ["xw", "B"], ["xb"]),
        helper.make_node("Relu", ["xb"], ["h"]),
        helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "ht"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", None])],
        [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_parameters_and_histogram(tiny: onnx.ModelProto) -> None:
    assert prof.parameters(tiny) == prof.Parameters(tensors=2, elements=40, bytes=160)
    assert prof.op_histogram(tiny) == (
        ("MatMul", 2),
        ("Add", 1),
        ("Relu", 1),
        ("Softmax", 1),
        ("Transpose", 1),
    )


def test_flops_per_token(tiny: onnx.ModelProto) -> None:
    est = prof.compute_estimate(tiny, seq=SEQ, machine_balance=10.0)
    by_node = {m.node: m for m in est.matmuls}
    assert by_node["proj"].kind == "weight"
    assert by_node["proj"].flops_per_token == 2 * 4 * 8
    assert by_node["proj"].weight_bytes == 4 * 8 * 4
    assert est.hidden == 4  # the only weight product's K
    assert by_node["scores"].kind == "activation"
    assert by_node["scores"].flops_per_token == 2 * SEQ * 4
    assert est.flops_per_token == 2 * 4 * 8 + 2 * SEQ * 4
    one, batch = est.intensity
    assert (one.tokens, batch.tokens) == (1, SEQ)
    assert one.flops_per_byte < batch.flops_per_byte  # weights amortise over tokens
    assert one.bound == "memory-bound"


def test_intensity_verdict_against_the_balance() -> None:
    assert prof.intensity(1000, 0, 10, 1, 10.0).bound == "compute-bound"
    assert prof.intensity(1000, 0, 10, 1, 200.0).bound == "memory-bound"


def test_dynamic_axes(tiny: onnx.ModelProto) -> None:
    axes = {(a.role, a.tensor, a.axis, a.name) for a in prof.dynamic_axes(tiny)}
    assert axes == {
        ("input", "x", 0, "batch"),
        ("input", "x", 1, "seq"),
        ("output", "y", 0, "batch"),
        ("output", "y", 1, "seq"),
        ("output", "y", 2, "?"),
    }


def test_matrix_marks_ops_an_ep_table_lacks() -> None:
    rows = {r.provider: r for r in prof.ep_matrix(["MatMul", "Range", "acme::Frobnicate"])}
    assert rows["CoreML"].unsupported == ("Range", "acme::Frobnicate")
    assert rows["CUDA"].unsupported == ("acme::Frobnicate",)
    assert rows["CPU"].unsupported == ("acme::Frobnicate",)
    assert not rows["CUDA"].installed
    assert "not installed here; static table" in rows["CUDA"].note
    assert rows["TensorRT"].checked_by == prof.STATIC_TABLE_SOURCE
    trt = prof.ep_matrix(["MatMulInteger", "DynamicQuantizeLinear"])[2]
    assert trt.provider == "TensorRT"
    assert trt.unsupported == ("DynamicQuantizeLinear", "MatMulInteger")


def test_cpu_row_is_verified_by_a_session(tiny: onnx.ModelProto) -> None:
    available = ort.get_available_providers()
    result = prof.profile(tiny, seq=SEQ, available=available)
    rows = prof.verify_installed(result.matrix, tiny.SerializeToString(), available)
    cpu = next(r for r in rows if r.provider == "CPU")
    assert (cpu.installed, cpu.checked_by, cpu.unsupported) == (True, "session", ())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "mlp").mkdir()
    shutil.copy(MODELS / "mlp" / "config.yaml", tmp_path / "mlp" / "config.yaml")
    build_into(tmp_path)
    return tmp_path


def test_cli_prints_the_tables(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "mlp", "--repository", str(repo)]) == 0
    out = capsys.readouterr().out
    for header in (
        "== parameters",
        "== op types (node count)",
        "== compute per token (ESTIMATES",
        "== dynamic axes",
        "== hardware evaluation matrix",
        "static table, onnxruntime 1.2x docs",
    ):
        assert header in out
    assert "131 elements in 4 initializers" in out


def test_cli_json(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "mlp", "--repository", str(repo), "--json", "--seq", "4"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parameters"]["elements"] == 131
    assert data["compute"]["seq"] == 4
    assert data["compute"]["flops_per_token"] == 2 * (4 * 16 + 16 * 3)
    assert data["matrix"][0]["provider"] == "CPU"


def test_cli_unknown_model(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "nope", "--repository", str(repo)]) == 1
    assert "unknown model" in capsys.readouterr().err
