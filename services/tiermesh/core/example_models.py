"""Triton's example models, built as ONNX so that Triton's own example clients work unchanged.

`simple`: INT32 INPUT0, INPUT1 [batch, 16] -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 -
INPUT1. `simple_string`: the same on BYTES tensors holding decimal strings; the graph itself
converts (Cast string -> int32, and back), so the model is served like any other one: the
router queues it, a worker batches and runs it, postprocess delivers it. `simple_identity`:
BYTES INPUT0 [batch, -1] -> OUTPUT0, the same elements back (Identity on strings; an element
may hold a NUL, and must be UTF-8 like every BYTES element an ONNX model reads).

A string that is not a decimal integer fails its Cast in onnxruntime; the worker then runs
the batch's requests one by one, so only that request fails. builtin_models.py turns these
graphs into model bytes (fixed IR version and opset: a reproducible sha256).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

WIDTH = 16


def _io(names: tuple[str, ...], elem_type: int) -> list[onnx.ValueInfoProto]:
    return [helper.make_tensor_value_info(n, elem_type, ["batch", WIDTH]) for n in names]


def simple_graph() -> onnx.GraphProto:
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        _io(("INPUT0", "INPUT1"), TensorProto.INT32),
        _io(("OUTPUT0", "OUTPUT1"), TensorProto.INT32),
    )
    return graph


def simple_string_graph() -> onnx.GraphProto:
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
            helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
            helper.make_node("Add", ["a", "b"], ["sum"]),
            helper.make_node("Sub", ["a", "b"], ["difference"]),
            helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
            helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING),
        ],
        "simple_string",
        _io(("INPUT0", "INPUT1"), TensorProto.STRING),
        _io(("OUTPUT0", "OUTPUT1"), TensorProto.STRING),
    )
    return graph


def simple_identity_graph() -> onnx.GraphProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "simple_identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])],
    )
    return graph
