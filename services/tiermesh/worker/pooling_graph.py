"""A model's pooling step (the config's `pool`: mean over the tokens the mask keeps, then L2
normalisation) appended to its ONNX graph, so onnxruntime computes the sentence embedding
in the batch's own session call.

Why: a worker that hands on every token's vector moves ~24 KB a 16-token text and ~390 KB a
256-token one through serialisation, the postprocess hop and numpy; the embedding is 1.5 KB.
Postprocess pools what still arrives unpooled (mean_pool_l2), with the same arithmetic in
the same order: float32 sums over the sequence, the count floored at 1e-9, the norm at 1e-12.

Pure: model bytes in, model bytes out (or None where the graph does not fit: the source is
not a graph output of three dimensions, the mask not a graph input, or an opset before 13).
External data stays external. The nodes, their constants and the new output are appended as
a second serialised ModelProto (protobuf merges a message written twice, appending repeated
fields), so the model is parsed once to check it but never serialised again: for
minilm-l6's 86 MB that is ~0.09 s at load instead of ~1.3 s. The source stays among the
graph's outputs; the worker asks onnxruntime only for the pooled one.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from tiermesh.core.model_config import PoolSpec

PREFIX = "tiermesh_pool/"
MIN_OPSET = 13  # ReduceSum and Unsqueeze take their axes as inputs from 13 on


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def with_pooling(data: bytes, spec: PoolSpec, external_ok: bool = True) -> bytes | None:
    """`data` (a serialised ModelProto) with `spec.source` pooled into `spec.output`
    ([batch, hidden] FP32), a graph output beside the source; None when the graph does not
    fit, or names external data and not `external_ok` (a session made from bytes alone
    could not find it)."""
    model = onnx.ModelProto()
    model.ParseFromString(data)
    graph = model.graph
    if not external_ok and any(t.data_location == TensorProto.EXTERNAL for t in graph.initializer):
        return None
    source = next((o for o in graph.output if o.name == spec.source), None)
    mask = next((i for i in graph.input if i.name == spec.mask), None)
    if source is None or mask is None or _opset(model) < MIN_OPSET:
        return None
    if len(source.type.tensor_type.shape.dim) != 3:
        return None
    if any(n.name.startswith(PREFIX) for n in graph.node):
        return None  # pooled already
    hidden = source.type.tensor_type.shape.dim[2]

    def name(s: str) -> str:
        return PREFIX + s

    added = onnx.ModelProto()  # merged into `data`: only what the graph gains
    graph = added.graph
    graph.initializer.extend(
        [
            helper.make_tensor(name("axis1"), TensorProto.INT64, [1], [1]),
            helper.make_tensor(name("axis2"), TensorProto.INT64, [1], [2]),
            helper.make_tensor(name("min_count"), TensorProto.FLOAT, [], [1e-9]),
            helper.make_tensor(name("min_norm"), TensorProto.FLOAT, [], [1e-12]),
        ]
    )
    tokens = spec.source
    if source.type.tensor_type.elem_type != TensorProto.FLOAT:
        graph.node.append(
            helper.make_node(
                "Cast", [tokens], [name("tokens")], name=name("cast_tokens"), to=TensorProto.FLOAT
            )
        )
        tokens = name("tokens")
    steps: list[tuple[str, list[str], str, dict[str, int]]] = [
        ("Cast", [spec.mask], "mask", {"to": TensorProto.FLOAT}),
        ("Unsqueeze", [name("mask"), name("axis2")], "weights", {}),  # [batch, seq, 1]
        ("Mul", [tokens, name("weights")], "weighted", {}),
        ("ReduceSum", [name("weighted"), name("axis1")], "summed", {"keepdims": 0}),
        ("ReduceSum", [name("weights"), name("axis1")], "count", {"keepdims": 0}),
        ("Max", [name("count"), name("min_count")], "count_floor", {}),
        ("Div", [name("summed"), name("count_floor")], "mean", {}),
        ("Mul", [name("mean"), name("mean")], "squares", {}),
        ("ReduceSum", [name("squares"), name("axis1")], "sum_squares", {"keepdims": 1}),
        ("Sqrt", [name("sum_squares")], "norm", {}),
        ("Max", [name("norm"), name("min_norm")], "norm_floor", {}),
    ]
    for op, inputs, result, attrs in steps:
        node = helper.make_node(op, inputs, [name(result)], name=name(result))
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        graph.node.append(node)
    graph.node.append(
        helper.make_node("Div", [name("mean"), name("norm_floor")], [spec.output], name=name("out"))
    )
    batch = source.type.tensor_type.shape.dim[0]
    pooled = helper.make_tensor_value_info(spec.output, TensorProto.FLOAT, [None, None])
    pooled.type.tensor_type.shape.dim[0].CopyFrom(batch)
    pooled.type.tensor_type.shape.dim[1].CopyFrom(hidden)
    graph.output.append(pooled)
    extra: bytes = added.SerializeToString()
    return data + extra
