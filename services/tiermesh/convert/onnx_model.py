"""An ONNX graph as a model's interface: inputs, outputs, KServe v2 datatypes, dynamic
dimensions, and whether (and how far) the model batches (`tiermesh models add`).

Reads the graph only (never the weights: external data stays on disk), so it costs little
for any model size. Everything it cannot turn into a config is refused with one line that
names the tensor and what is wrong with it (ModelAddError).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto

from tiermesh.core.model_config import NAME, TOKEN_IDS, TOKEN_MASK, RepositoryError, TensorSpec
from tiermesh.core.model_files import external_locations
from tiermesh.core.tensors import BYTES, TensorData, element_count, element_size, to_numpy


class ModelAddError(ValueError):
    """The file, folder or options given cannot become a model; the message says why and
    nothing was written to the repository."""


# ONNX element types the mesh carries, as KServe v2 datatypes (core/tensors.py DATATYPES).
DATATYPE_OF_ELEM: Mapping[int, str] = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.DOUBLE: "FP64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.STRING: BYTES,
}

# An unknown model's cost per row is unknown (an image row may cost milliseconds): batch
# moderately by default; --max-batch-size says otherwise.
DEFAULT_MAX_BATCH_SIZE = 8
DYNAMIC = -1


@dataclass(frozen=True, slots=True)
class GraphTensor:
    """One input or output of the graph: its whole shape (batch dimension included)."""

    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: a symbolic or unknown dimension

    def shown(self) -> str:
        return f"{self.name} {self.datatype} {list(self.shape)}"


@dataclass(frozen=True, slots=True)
class GraphInfo:
    path: Path
    inputs: tuple[GraphTensor, ...]
    outputs: tuple[GraphTensor, ...]
    # External-data locations, as the graph names them (relative to the file's folder).
    external: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Interface:
    """What a config says about the tensors: dims without the batch dimension when it
    batches (max_batch_size > 0), the whole shape otherwise."""

    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    why: str  # how max_batch_size was chosen, for the summary


def read_graph(path: Path) -> GraphInfo:
    """The graph's interface and external-data locations; ModelAddError when the file is
    not an ONNX model or has a tensor the mesh cannot carry."""
    data = path.read_bytes()
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # the protobuf parser raises several types
        raise ModelAddError(f"{path}: not an ONNX model ({exc})") from None
    if not model.HasField("graph") or not model.graph.output or model.ir_version < 1:
        raise ModelAddError(f"{path}: not an ONNX model (no graph with outputs in it)")
    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # inference is a help for unshaped outputs, never a requirement
        inferred = model.graph
    known = {v.name: v for v in [*inferred.value_info, *inferred.output]}
    fed = {i.name for i in model.graph.initializer}
    inputs = tuple(_tensor(path, "input", v) for v in model.graph.input if v.name not in fed)
    outputs = tuple(
        _tensor(path, "output", v if _shaped(v) else known.get(v.name, v))
        for v in model.graph.output
    )
    if not inputs:
        raise ModelAddError(f"{path}: the graph has no inputs (only initializers)")
    try:
        external = tuple(external_locations(data, path))
    except RepositoryError as exc:
        raise ModelAddError(str(exc)) from None
    return GraphInfo(path, inputs, outputs, external)


def _shaped(value: onnx.ValueInfoProto) -> bool:
    return bool(value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"))


def _tensor(path: Path, kind: str, value: onnx.ValueInfoProto) -> GraphTensor:
    where = f"{path}: {kind} {value.name!r}"
    if not value.type.HasField("tensor_type"):
        what = value.type.WhichOneof("value") or "untyped"
        raise ModelAddError(f"{where} is a {what}, not a tensor; the mesh carries tensors only")
    tensor = value.type.tensor_type
    datatype = DATATYPE_OF_ELEM.get(tensor.elem_type)
    if datatype is None:
        elem = TensorProto.DataType.Name(tensor.elem_type)
        raise ModelAddError(
            f"{where} has element type {elem}, which the mesh cannot carry "
            f"(it carries {', '.join(sorted(set(DATATYPE_OF_ELEM.values())))})"
        )
    if not tensor.HasField("shape"):
        raise ModelAddError(
            f"{where} has no shape in the graph (rank unknown); the config needs its rank"
        )
    dims = []
    for d in tensor.shape.dim:
        # Some exporters (Paddle2ONNX) write a dynamic dimension as the value -1.
        if d.HasField("dim_value") and d.dim_value == DYNAMIC:
            dims.append(DYNAMIC)
            continue
        if d.HasField("dim_value") and d.dim_value < 1:
            raise ModelAddError(f"{where} has a dimension of {d.dim_value}")
        dims.append(d.dim_value if d.HasField("dim_value") else DYNAMIC)
    return GraphTensor(value.name, datatype, tuple(dims))


def cannot_batch(graph: GraphInfo) -> str:
    """Why the graph cannot batch (a tensor without a dynamic first dimension), or ""."""
    for t in (*graph.inputs, *graph.outputs):
        if not t.shape:
            return f"{t.name!r} is a scalar"
        if t.shape[0] != DYNAMIC:
            return f"{t.name!r} has a fixed first dimension ({t.shape[0]})"
    return ""


def plan_interface(graph: GraphInfo, max_batch_size: int | None) -> Interface:
    """The config's tensors and batching: a model batches when every input's and output's
    first dimension is dynamic (max_batch_size: `max_batch_size`, else the default); with a
    fixed first dimension anywhere it does not (max_batch_size 0, whole shapes). 0 asks for
    no batching whatever the graph says."""
    reason = cannot_batch(graph)
    if reason:
        if max_batch_size:
            raise ModelAddError(
                f"{graph.path}: cannot batch: {reason}; leave out --max-batch-size "
                "(the model then takes whole shapes, max_batch_size 0)"
            )
        chosen, why = 0, f"does not batch: {reason}"
    elif max_batch_size == 0:
        chosen, why = 0, "does not batch (--max-batch-size 0): dims are whole shapes"
    elif max_batch_size is None:
        chosen = DEFAULT_MAX_BATCH_SIZE
        why = (
            f"batches up to {chosen} rows (every first dimension is dynamic; the default, "
            "--max-batch-size to change it)"
        )
    else:
        chosen = max_batch_size
        why = f"batches up to {chosen} rows (--max-batch-size)"
    skip = 1 if chosen > 0 else 0
    return Interface(
        chosen,
        tuple(TensorSpec(t.name, t.datatype, t.shape[skip:]) for t in graph.inputs),
        tuple(TensorSpec(t.name, t.datatype, t.shape[skip:]) for t in graph.outputs),
        why,
    )


def sanitised_name(stem: str) -> str:
    """A model name (NAME) from a file stem: other characters become '-'."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-")
    return name if name and NAME.match(name) else "model"


def zeros(specs: Sequence[TensorSpec], batch: int, size: int) -> dict[str, npt.NDArray[np.generic]]:
    """Feeds of zeros (empty strings for BYTES) of the declared shapes: `batch` rows when
    `batch` > 0 (the model batches), `size` for every dynamic dimension."""
    feeds: dict[str, npt.NDArray[np.generic]] = {}
    for spec in specs:
        shape = ((batch,) if batch else ()) + tuple(size if d == DYNAMIC else d for d in spec.dims)
        if spec.datatype == BYTES:
            feeds[spec.name] = np.full(shape, "", dtype=object)
            continue
        raw = bytes(element_count(shape) * element_size(spec.datatype))
        feeds[spec.name] = to_numpy(TensorData(spec.name, spec.datatype, shape, raw))
    return feeds


def shape_fits(declared: Sequence[int], got: Sequence[int]) -> bool:
    """Whether an actual shape is one the declared dims (-1: any) allow."""
    return len(declared) == len(got) and all(
        want in (DYNAMIC, have) for want, have in zip(declared, got, strict=True)
    )


TEXT_INPUT = "text"
POOLED_OUTPUT = "sentence_embedding"


@dataclass(frozen=True, slots=True)
class TextInterface:
    """A text model (`--tokenizer`): clients send text (BYTES [1] per row); the router
    tokenizes it into the graph's input_ids and attention_mask; a last-hidden-state output
    ([batch, tokens, H]) is mean-pooled into `sentence_embedding` [H]."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    compute_inputs: tuple[TensorSpec, ...]
    compute_outputs: tuple[TensorSpec, ...]
    pool_source: str  # "" when nothing is pooled


def text_interface(graph: GraphInfo, interface: Interface) -> TextInterface:
    """The public and compute interfaces of a text model over `graph`; ModelAddError when the
    graph does not take exactly what the router's tokenizer gives."""
    wanted = {TOKEN_IDS, TOKEN_MASK}
    taken = {t.name: t for t in interface.inputs}
    if set(taken) != wanted:
        raise ModelAddError(
            f"{graph.path}: --tokenizer needs a graph taking exactly {TOKEN_IDS} and "
            f"{TOKEN_MASK} (INT64 [batch, tokens]); this one takes "
            f"{', '.join(t.shown() for t in graph.inputs)}"
        )
    if interface.max_batch_size == 0 or any(
        t.datatype != "INT64" or t.dims != (DYNAMIC,) for t in taken.values()
    ):
        raise ModelAddError(
            f"{graph.path}: --tokenizer needs {TOKEN_IDS} and {TOKEN_MASK} as INT64 "
            f"[batch, tokens] with both dimensions dynamic; the graph has "
            f"{', '.join(t.shown() for t in graph.inputs)}"
        )
    hidden = [t for t in interface.outputs if len(t.dims) == 2 and t.dims[0] == DYNAMIC]
    pooled = hidden[0] if len(hidden) == 1 and hidden[0].dims[1] > 0 else None
    if pooled is not None and pooled.datatype != "FP32":
        pooled = None
    outputs = tuple(
        TensorSpec(POOLED_OUTPUT, "FP32", (t.dims[1],)) if t is pooled else t
        for t in interface.outputs
    )
    compute = tuple(taken[n] for n in (TOKEN_IDS, TOKEN_MASK))
    return TextInterface(
        inputs=(TensorSpec(TEXT_INPUT, BYTES, (1,)),),
        outputs=outputs,
        compute_inputs=compute,
        compute_outputs=interface.outputs,
        pool_source=pooled.name if pooled is not None else "",
    )
