"""A tiny ONNX model whose answer is larger than its request: `tile` repeats each row of
INPUT0 (FP32, [batch, n]) REPEATS times (OUTPUT0: [batch, n * REPEATS]). For the tests of
the byte bounds on batches and hand-offs: small requests whose answers add up past a
message limit, and one whose answer alone does."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from tiermesh.core.builtin_models import IR_VERSION, OPSET

NAME = "tile"
REPEATS = 16


def build_tile() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Tile", ["INPUT0", "repeats"], ["OUTPUT0"])],
        NAME,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "m"])],
        initializer=[numpy_helper.from_array(np.array([1, REPEATS], np.int64), "repeats")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    return bytes(model.SerializeToString())


def config_text(sha256: str) -> str:
    return f"""name: {NAME}
platform: onnxruntime_onnx
max_batch_size: 32
inputs:
  - {{name: INPUT0, datatype: FP32, dims: [-1]}}
outputs:
  - {{name: OUTPUT0, datatype: FP32, dims: [-1]}}
batching:
  max_batch_wait_ms: 2
queue_bound: 1024
priority_levels: 2
default_priority: 2
versions:
  "1":
    model.onnx: {sha256}
"""


def write_tile(repo: Path) -> Path:
    """The model's folder in the repository at `repo` (config and weights); its file."""
    data = build_tile()
    folder = repo / NAME
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(data)
    (folder / "config.yaml").write_text(config_text(hashlib.sha256(data).hexdigest()))
    return folder / "1" / "model.onnx"
