"""Graph surgery on exported ONNX models: keep one output under a new name, drop the rest.

Called by the MiniLM fetch on exports that carry extra outputs (pooled vectors, echoed
inputs) so that the served model has exactly the contract its config declares. Only what
the kept output depends on survives; the arithmetic of what survives is untouched.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import onnx
from onnx import helper


class RewriteError(ValueError):
    """The model cannot be rewritten as asked."""


def _subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
        for g in graphs:
            for inner in g.node:
                names.update(inner.input)
                names.update(_subgraph_inputs(inner))
    return names


def _needed_nodes(nodes: Sequence[onnx.NodeProto], output: str) -> list[onnx.NodeProto]:
    """The nodes `output` depends on, in their original (topological) order."""
    producer = {name: i for i, n in enumerate(nodes) for name in n.output if name}
    keep: set[int] = set()
    pending = [output]
    while pending:
        i = producer.get(pending.pop())
        if i is None or i in keep:
            continue
        keep.add(i)
        pending.extend(n for n in nodes[i].input if n)
        pending.extend(_subgraph_inputs(nodes[i]))
    return [n for i, n in enumerate(nodes) if i in keep]


def _renamed(names: Iterable[str], old: str, new: str) -> list[str]:
    return [new if n == old else n for n in names]


def keep_single_output(
    model: onnx.ModelProto, source: str, target: str, dims: Sequence[int | str]
) -> onnx.ModelProto:
    """A copy of `model` whose only output is the tensor `source`, renamed `target`, with
    the declared shape `dims`; nodes, initializers, graph inputs and value infos that no
    longer contribute are dropped. Raises RewriteError when `source` is not a graph output
    or `target` already names another tensor. Passes onnx.checker."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    declared = next((o for o in g.output if o.name == source), None)
    if declared is None:
        raise RewriteError(f"{source!r} is not an output (outputs: {[o.name for o in g.output]})")
    taken = {t for n in g.node for t in (*n.input, *n.output)} | {i.name for i in g.initializer}
    if target != source and target in taken | {i.name for i in g.input}:
        raise RewriteError(f"{target!r} already names a tensor in the graph")
    elem_type = declared.type.tensor_type.elem_type
    for node in g.node:
        node.input[:] = _renamed(node.input, source, target)
        node.output[:] = _renamed(node.output, source, target)
    kept = _needed_nodes(list(g.node), target)
    used = {name for n in kept for name in (*n.input, *_subgraph_inputs(n))}
    del g.node[:]
    g.node.extend(kept)
    inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(inits)
    values = [v for v in g.value_info if v.name in used and v.name != target]
    del g.value_info[:]
    g.value_info.extend(values)
    # Graph inputs stay even when unused: callers feed them, and dropping one would change
    # the model's contract. Only the outputs change.
    del g.output[:]
    g.output.append(helper.make_tensor_value_info(target, elem_type, list(dims)))
    onnx.checker.check_model(out)
    return out
