"""A Triton model folder (`config.pbtxt` + `<version>/model.onnx`) as a ModelDraft
(`tiermesh models import-triton`).

config.pbtxt is parsed by protobuf's text_format into tritonclient's ModelConfig message;
every field set in it is either mapped onto config.yaml, printed as a note saying why it
needs nothing here, or named in one refusal listing all of them: nothing is dropped
silently. What maps:

| Triton | tiermesh |
|---|---|
| name | name (--name wins) |
| platform onnxruntime_onnx, backend onnxruntime | platform (anything else refused) |
| max_batch_size | max_batch_size |
| input / output: name, data_type, dims | inputs / outputs (TYPE_STRING -> BYTES, ...) |
| input / output reshape | only when it equals dims (a no-op); the mesh does not reshape |
| input format (NCHW, NHWC) | a note: it only describes the layout |
| dynamic_batching max_queue_delay_microseconds | batching.max_batch_wait_ms |
| dynamic_batching preferred_batch_size | one length bucket with preferred_batch_sizes |
| dynamic_batching priority_levels, default_priority_level | priority_levels, default_priority |
| no dynamic_batching | batching.max_batch_wait_ms 0 (no batch is held open) |
| version_policy latest / all / specific | which version folders are imported |
| instance_group KIND_CPU/AUTO/GPU, count, gpus, name | a note (see `_instances`) |
| default_model_filename | the file read in each version folder |
| response_cache enable | response_cache.enabled |
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import text_format  # type: ignore[import-untyped]
from google.protobuf.message import Message  # type: ignore[import-untyped]

from tiermesh.convert.add_model import (
    MODEL_FILE,
    ModelDraft,
    VersionSource,
    external_files,
    tensor_entries,
)
from tiermesh.convert.onnx_model import (
    DYNAMIC,
    GraphInfo,
    GraphTensor,
    ModelAddError,
    cannot_batch,
    plan_interface,
    read_graph,
    sanitised_name,
)
from tiermesh.core.model_config import NAME, TensorSpec

PBTXT = "config.pbtxt"
PLATFORM = "onnxruntime_onnx"
BACKEND = "onnxruntime"
DATATYPE_OF_TRITON = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
}
# Fields of each message that are mapped (or noted); any other field set is refused.
_MAPPED = {
    "ModelConfig": {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "version_policy",
        "instance_group",
        "default_model_filename",
        "response_cache",
    },
    "ModelInput": {"name", "data_type", "dims", "reshape", "format"},
    "ModelOutput": {"name", "data_type", "dims", "reshape"},
    "ModelDynamicBatching": {
        "preferred_batch_size",
        "max_queue_delay_microseconds",
        "priority_levels",
        "default_priority_level",
    },
    "ModelInstanceGroup": {"name", "kind", "count", "gpus"},
    "ModelVersionPolicy": {"latest", "all", "specific"},
    "Latest": {"num_versions"},
    "All": set(),
    "Specific": {"versions"},
    "ModelResponseCache": {"enable"},
}


@dataclass
class _Reading:
    """What reading config.pbtxt found: refused fields (path -> why), notes to print."""

    refused: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def refuse(self, path: str, why: str = "") -> None:
        self.refused.setdefault(path, why)


def triton_draft(folder: Path, name: str | None = None) -> ModelDraft:
    """The model of a Triton model folder; ModelAddError naming every field of its
    config.pbtxt that cannot be imported, or what else is wrong (files, interface)."""
    from tritonclient.grpc import model_config_pb2 as mc

    pbtxt = folder / PBTXT
    if not pbtxt.is_file():
        raise ModelAddError(
            f"{folder}: no {PBTXT} (a Triton model folder holds {PBTXT} and <version>/{MODEL_FILE})"
        )
    triton = mc.ModelConfig()
    try:
        text_format.Parse(pbtxt.read_text(), triton)
    except text_format.ParseError as exc:
        raise ModelAddError(f"{pbtxt}: not a Triton model config ({exc})") from None
    reading = _Reading()
    for path in _unmapped(triton, ""):
        reading.refuse(path)
    _check_platform(triton, reading)
    declared_in = _declared(triton.input, "input", reading)
    declared_out = _declared(triton.output, "output", reading)
    batching = _batching(triton, reading)
    _instances(triton, mc, reading)
    if reading.refused:
        raise ModelAddError(_refusal(pbtxt, reading.refused))

    name = name or triton.name or sanitised_name(folder.name)
    if not NAME.match(name):
        raise ModelAddError(f"model name {name!r} must match {NAME.pattern}; give --name")
    file = triton.default_model_filename or MODEL_FILE
    versions = _versions(folder, triton, file)
    graphs = [read_graph(folder / v / file) for v in versions]
    mbs = int(triton.max_batch_size)
    if declared_in and declared_out:
        inputs, outputs = declared_in, declared_out
        for graph in graphs:
            _check_against(graph, inputs, outputs, mbs)
    else:
        if mbs > 0 and (reason := cannot_batch(graphs[-1])):
            raise ModelAddError(
                f"{pbtxt}: max_batch_size is {mbs}, but the graph of version {versions[-1]} "
                f"cannot batch: {reason}"
            )
        derived = plan_interface(graphs[-1], mbs)
        inputs = declared_in or derived.inputs
        outputs = declared_out or derived.outputs
        for graph in graphs:
            _check_against(graph, inputs, outputs, mbs)
        reading.notes.append(
            "interface: "
            + ("outputs" if declared_in else "inputs" if declared_out else "inputs and outputs")
            + f" read from the graph of version {versions[-1]} ({PBTXT} declares none)"
        )
    config: dict[str, Any] = {
        "name": name,
        "platform": PLATFORM,
        "max_batch_size": mbs,
        "inputs": tensor_entries(inputs),
        "outputs": tensor_entries(outputs),
        **batching,
    }
    if triton.response_cache.enable:
        config["response_cache"] = {"enabled": True}
    summary = [
        *(f"input {t.name} {t.datatype} dims {list(t.dims)}" for t in inputs),
        *(f"output {t.name} {t.datatype} dims {list(t.dims)}" for t in outputs),
        f"batching: {_batching_words(mbs, batching)}",
        f"versions: {', '.join(versions)} ({_policy_words(triton)})",
        *(f"note: {n}" for n in reading.notes),
    ]
    return ModelDraft(
        name=name,
        config=config,
        versions=tuple(
            VersionSource(v, g.path, external_files(g))
            for v, g in zip(versions, graphs, strict=True)
        ),
        header=(
            f"Imported by `tiermesh models import-triton` from {pbtxt.resolve()}.",
            f"Versions {', '.join(versions)}; every field of {PBTXT} is mapped here or was "
            "printed as a note when imported.",
        ),
        summary=tuple(summary),
        comments={
            "length_buckets": "Triton's preferred_batch_size: one bucket, which takes every "
            "length (the last bucket catches all longer ones), so its bound changes nothing."
        },
    )


def _unmapped(message: Message, prefix: str) -> Iterator[str]:
    """Paths of the fields set in `message` (recursively, as ListFields sees them) that no
    mapping takes."""
    mapped = _MAPPED.get(message.DESCRIPTOR.name)
    for fd, value in message.ListFields():
        path = f"{prefix}{fd.name}"
        if mapped is None or fd.name not in mapped:
            yield path
            continue
        if fd.message_type is None or fd.message_type.GetOptions().map_entry:
            continue
        items = value if _repeated(fd) else [value]
        for i, item in enumerate(items):
            label = getattr(item, "name", "") or str(i)
            where = f"{path}[{label}]." if _repeated(fd) else f"{path}."
            if fd.message_type.name in _MAPPED:
                yield from _unmapped(item, where)


def _repeated(fd: Any) -> bool:
    repeated = getattr(fd, "is_repeated", None)  # protobuf 6; `label` before it
    return bool(repeated if repeated is not None else fd.label == fd.LABEL_REPEATED)


def _check_platform(triton: Any, reading: _Reading) -> None:
    if triton.platform and triton.platform != PLATFORM:
        reading.refuse("platform", f"{triton.platform}: only {PLATFORM} is served")
    if triton.backend and triton.backend != BACKEND:
        reading.refuse("backend", f"{triton.backend}: only {BACKEND} is served")


def _declared(tensors: Sequence[Any], kind: str, reading: _Reading) -> tuple[TensorSpec, ...]:
    out = []
    for t in tensors:
        where = f"{kind}[{t.name}]"
        type_name = _type_name(t)
        datatype = DATATYPE_OF_TRITON.get(type_name)
        if datatype is None:
            reading.refuse(f"{where}.data_type", f"{type_name}: the mesh cannot carry it")
            continue
        dims = tuple(int(d) for d in t.dims)
        if any(d < 1 and d != DYNAMIC for d in dims):
            reading.refuse(f"{where}.dims", f"{list(dims)}: dims are positive or -1")
        if t.HasField("reshape") and tuple(t.reshape.shape) != dims:
            reading.refuse(
                f"{where}.reshape",
                f"dims {list(dims)} reshaped to {list(t.reshape.shape)}: the mesh hands the "
                "model what the client sent",
            )
        if kind == "input" and t.format:
            fmt = type(t).Format.Name(t.format)
            reading.notes.append(f"{where}.format {fmt} describes the layout only; not carried")
        out.append(TensorSpec(t.name, datatype, dims))
    return tuple(out)


def _type_name(tensor: Any) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return str(mc.DataType.Name(tensor.data_type))


def _batching(triton: Any, reading: _Reading) -> dict[str, Any]:
    """The batching sections of config.yaml for the config's dynamic_batching."""
    mbs = int(triton.max_batch_size)
    if not triton.HasField("dynamic_batching"):
        # Triton runs each request as it came; the nearest here is a batch never held open.
        return {"batching": {"max_batch_wait_ms": 0}} if mbs > 0 else {}
    dyn = triton.dynamic_batching
    if mbs < 1:
        reading.refuse("dynamic_batching", "needs max_batch_size > 0")
        return {}
    out: dict[str, Any] = {}
    preferred = sorted({int(p) for p in dyn.preferred_batch_size})
    if bad := [p for p in preferred if not 1 <= p <= mbs]:
        reading.refuse(
            "dynamic_batching.preferred_batch_size", f"{bad} outside 1..max_batch_size {mbs}"
        )
    elif preferred:
        # One bucket: the last bucket takes every length, so its bound changes nothing.
        out["length_buckets"] = [{"max_length": 1, "preferred_batch_sizes": preferred}]
    out["batching"] = {"max_batch_wait_ms": dyn.max_queue_delay_microseconds / 1000}
    if dyn.priority_levels:
        out["priority_levels"] = int(dyn.priority_levels)
        if dyn.default_priority_level:
            if dyn.default_priority_level > dyn.priority_levels:
                reading.refuse("dynamic_batching.default_priority_level", "above priority_levels")
            out["default_priority"] = int(dyn.default_priority_level)
    elif dyn.default_priority_level:
        reading.refuse("dynamic_batching.default_priority_level", "without priority_levels")
    return out


def _instances(triton: Any, mc: Any, reading: _Reading) -> None:
    kinds = mc.ModelInstanceGroup.Kind
    for i, group in enumerate(triton.instance_group):
        kind = kinds.Name(group.kind)
        if kind not in ("KIND_AUTO", "KIND_CPU", "KIND_GPU"):
            reading.refuse(f"instance_group[{group.name or i}].kind", f"{kind}")
            continue
        what = [kind] + ([f"count {group.count}"] if group.count else [])
        what += [f"gpus {list(group.gpus)}"] if group.gpus else []
        device = (
            "a GPU is asked for by `tiers.<tier>.execution_providers: [cuda]` in config.yaml "
            "or TIERMESH_EXECUTION_PROVIDERS=cuda on the worker; imported to run on CPU; "
            if kind == "KIND_GPU" or group.gpus
            else ""
        )
        reading.notes.append(
            f"instance_group {', '.join(what)} is not written: {device}"
            "how many workers serve a model is the deployment's choice"
        )


def _refusal(pbtxt: Path, refused: dict[str, str]) -> str:
    plain = [path for path, reason in refused.items() if not reason]
    reasons = [f"{path}: {reason}" for path, reason in refused.items() if reason]
    if plain and reasons:
        reasons.append(f"{', '.join(plain)}: no tiermesh equivalent")
    why = "; ".join(reasons) if reasons else "no tiermesh equivalent"
    return (
        f"{pbtxt}: cannot import field(s) {', '.join(refused)}: {why} "
        f"(nothing was added; remove them from {PBTXT} to import the rest)"
    )


def _versions(folder: Path, triton: Any, file: str) -> list[str]:
    """The version folders the version policy serves, oldest first."""
    present = sorted((p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=int)
    policy = triton.version_policy
    which = policy.WhichOneof("policy_choice") if triton.HasField("version_policy") else None
    if which == "all":
        chosen = present
    elif which == "specific":
        wanted = [str(v) for v in policy.specific.versions]
        if missing := [v for v in wanted if v not in present]:
            raise ModelAddError(
                f"{folder}: version_policy specific names version(s) {', '.join(missing)}, "
                f"which have no folder (found: {', '.join(present) or 'none'})"
            )
        chosen = sorted(set(wanted), key=int)
    else:
        count = policy.latest.num_versions if which == "latest" else 1
        chosen = present[-max(count, 1) :]
    if not chosen:
        raise ModelAddError(f"{folder}: no version folder (1/, 2/, ...) holding {file}")
    for version in chosen:
        path = folder / version / file
        if not path.is_file():
            raise ModelAddError(
                f"{path}: missing or not a file (a model folder in place of the ONNX file "
                "is not supported)"
            )
    return chosen


def _policy_words(triton: Any) -> str:
    if not triton.HasField("version_policy"):
        return "Triton's default policy: the latest"
    policy = triton.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "latest":
        return f"version_policy latest {policy.latest.num_versions}"
    return f"version_policy {which}"


def _batching_words(mbs: int, batching: dict[str, Any]) -> str:
    if mbs == 0:
        return "does not batch (max_batch_size 0): dims are whole shapes"
    wait = batching["batching"]["max_batch_wait_ms"]
    words = f"batches up to {mbs} rows, waiting at most {wait} ms"
    if buckets := batching.get("length_buckets"):
        words += f", preferred batch sizes {buckets[0]['preferred_batch_sizes']}"
    return words


def _check_against(
    graph: GraphInfo, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], mbs: int
) -> None:
    """ModelAddError unless the declared interface is one the graph takes and gives."""
    graph_in = {t.name: t for t in graph.inputs}
    graph_out = {t.name: t for t in graph.outputs}
    problems = []
    if missing := sorted(set(graph_in) - {t.name for t in inputs}):
        problems.append(f"the graph also needs input(s) {', '.join(missing)}")
    for kind, specs, known in (("input", inputs, graph_in), ("output", outputs, graph_out)):
        for spec in specs:
            found = known.get(spec.name)
            if found is None:
                problems.append(f"{kind} {spec.name} is not in the graph")
            elif why := _mismatch(spec, found, mbs):
                problems.append(f"{kind} {spec.name}: {why}")
    if problems:
        raise ModelAddError(f"{graph.path}: does not match {PBTXT}: {'; '.join(problems)}")


def _mismatch(spec: TensorSpec, graph: GraphTensor, mbs: int) -> str:
    full = ((DYNAMIC,) if mbs > 0 else ()) + spec.dims
    if spec.datatype != graph.datatype:
        return f"{PBTXT} says {spec.datatype}, the graph {graph.datatype}"
    if len(full) != len(graph.shape) or any(
        have != DYNAMIC and want != have for want, have in zip(full, graph.shape, strict=True)
    ):
        batch = " (batch dimension first)" if mbs > 0 else ""
        return f"{PBTXT} says shape {list(full)}{batch}, the graph {list(graph.shape)}"
    return ""
