"""What the ONNX graph builders share (bert_graph.py, llama.py): nodes and initializers
collected in order, each node named after its output, and the checked model at the end."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Fixed so that the bytes, and so the sha256 recorded in provenance and configs, do not
# depend on the installed onnx version. Opset 17 is the first with LayerNormalization.
IR_VERSION = 8
OPSET = 17


class GraphBuilder:
    """Collects nodes and initializers; names every node after its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[TensorProto] = []

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def model(
        self,
        name: str,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        producer: tuple[str, str],
        check: bool = True,
    ) -> onnx.ModelProto:
        """The graph as a model (opset OPSET, IR_VERSION), checked by onnx.checker unless the
        caller checks the serialized bytes itself (`check=False`: the checker serializes a
        ModelProto, one more copy of every weight)."""
        graph = helper.make_graph(self.nodes, name, inputs, outputs, initializer=self.inits)
        # Protobuf copies at each step: drop every copy once the next one holds it, so a
        # large model (SmolLM2's 538 MB) is not held three times over.
        self.inits, self.nodes = [], []
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            producer_name=producer[0],
            producer_version=producer[1],
        )
        del graph
        if check:
            onnx.checker.check_model(model)
        return model
