"""Models the repository builds itself with onnx.helper, byte-for-byte reproducibly.

`mlp`: FP32 [batch, 4] -> Gemm(4x16) -> Relu -> Gemm(16x3) -> OUTPUT0 [batch, 3], seeded weights.
`echo`: BYTES (ONNX string) [batch, -1] -> Identity -> ECHO; exercises text tensors end to end.
`simple`, `simple_string`, `simple_identity`: Triton's example models (core/example_models.py).
The IR version, opset and producer are fixed so that the bytes (and so the sha256 committed
in models/<name>/config.yaml) do not depend on the installed onnx version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tiermesh.core.example_models import (
    simple_graph,
    simple_identity_graph,
    simple_string_graph,
)

IR_VERSION = 8
OPSET = 17


def _model(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tiermesh",
        producer_version="1",
    )
    onnx.checker.check_model(model)
    return bytes(model.SerializeToString())


MLP_SEED = 20261130


def build_mlp(seed: int = MLP_SEED) -> bytes:
    """The mlp; another `seed` gives the same graph with other weights (tests build model
    versions that answer differently this way)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((4, 16)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    w2 = rng.standard_normal((16, 3)).astype(np.float32)
    b2 = rng.standard_normal(3).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["INPUT0", "w1", "b1"], ["h"]),
            helper.make_node("Relu", ["h"], ["hr"]),
            helper.make_node("Gemm", ["hr", "w2", "b2"], ["OUTPUT0"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
    )
    return _model(graph)


def build_echo() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["TEXT"], ["ECHO"])],
        "echo",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("ECHO", TensorProto.STRING, ["batch", "n"])],
    )
    return _model(graph)


BUILDERS: dict[str, Callable[[], bytes]] = {
    "mlp": build_mlp,
    "echo": build_echo,
    "simple": lambda: _model(simple_graph()),
    "simple_string": lambda: _model(simple_string_graph()),
    "simple_identity": lambda: _model(simple_identity_graph()),
}


def build_into(root: Path, version: str = "1") -> list[Path]:
    """Write every built-in model that has a config under `root`; return the files written."""
    written = []
    for name, builder in BUILDERS.items():
        if not (root / name / "config.yaml").exists():
            continue
        path = root / name / version / "model.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = builder()
        if not path.exists() or path.read_bytes() != data:
            path.write_bytes(data)
        written.append(path)
    return written
