"""Adding a model to the repository: the files copied into models/<name>/<version>/, their
sha256s, config.yaml written, and the proof that it loads and runs, all or nothing.

`tiermesh models add` (an ONNX file, `onnx_draft`) and `tiermesh models import-triton`
(convert/triton_import.py) each describe the model as a ModelDraft; `add_model` writes it.
Everything is written into a hidden staging folder of the repository first, loaded from
there through ModelRepository (checksums, external data) and run once by onnxruntime;
only a model that ran is moved into place, and the repository is loaded again with it.
Any refusal leaves the repository as it was.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from tiermesh.convert.onnx_model import (
    DYNAMIC,
    GraphInfo,
    ModelAddError,
    plan_interface,
    read_graph,
    shape_fits,
    text_interface,
    zeros,
)
from tiermesh.core.model_config import (
    NAME,
    TOKEN_IDS,
    TOKEN_MASK,
    ModelConfig,
    RepositoryError,
    TensorSpec,
)
from tiermesh.core.model_files import check_external
from tiermesh.core.repository import ModelRepository, sha256_file

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
DEFAULT_MAX_LENGTH = 256
# Sizes tried for the dynamic dimensions (batch aside) when proving that a model runs:
# the first the model takes wins (a 3x3 convolution without padding takes no 1x1 image).
PROBE_SIZES = (1, 8, 64, 224)
PROBE_ROWS = 2  # rows of the proof run of a batching model: batching itself is proven


@dataclass(frozen=True, slots=True)
class VersionSource:
    """Where one version's files come from: its ONNX file (written as model.onnx) and the
    files beside it (external data, a tokenizer), by their name in the version folder."""

    version: str
    model: Path
    extra: Mapping[str, Path] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelDraft:
    """A model as it will be written: config.yaml's sections (all but `versions`, in the
    order written), the comment lines above them, and what to print about the choices."""

    name: str
    config: Mapping[str, Any]
    versions: tuple[VersionSource, ...]
    header: tuple[str, ...]
    summary: tuple[str, ...]
    # section -> a comment line written above it
    comments: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Added:
    folder: Path
    # version -> file -> sha256
    files: Mapping[str, Mapping[str, str]]
    # version -> the proof run, in words
    ran: Mapping[str, str]


def tensor_entries(specs: Sequence[TensorSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "datatype": t.datatype, "dims": list(t.dims)} for t in specs]


def external_files(graph: GraphInfo) -> dict[str, Path]:
    """The external-data files the graph names (beside it); ModelAddError when one is
    missing or named by a path that leads out of the model's folder."""
    folder = graph.path.parent
    out: dict[str, Path] = {}
    for location in graph.external:
        try:
            name = str(check_external(folder, location, graph.path))
        except RepositoryError as exc:
            raise ModelAddError(str(exc)) from None
        source = folder / name
        if not source.is_file():
            raise ModelAddError(
                f"{graph.path}: its external data {location!r} is missing (looked for {source})"
            )
        if name == MODEL_FILE:
            raise ModelAddError(f"{graph.path}: external data named {MODEL_FILE} is not supported")
        out[name] = source
    return out


def onnx_draft(
    path: Path,
    name: str,
    version: str = "1",
    max_batch_size: int | None = None,
    tokenizer: Path | None = None,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> ModelDraft:
    """What `tiermesh models add PATH` writes: the interface and batching read from the
    graph (convert/onnx_model.py), a text model's sections when given a tokenizer."""
    if not NAME.match(name):
        raise ModelAddError(f"model name {name!r} must match {NAME.pattern}")
    if not NAME.match(version):
        raise ModelAddError(f"version {version!r} must match {NAME.pattern} (e.g. 1)")
    graph = read_graph(path)
    interface = plan_interface(graph, max_batch_size)
    extra = external_files(graph)
    config: dict[str, Any] = {
        "name": name,
        "platform": "onnxruntime_onnx",
        "max_batch_size": interface.max_batch_size,
    }
    lines = [
        f"{kind} {t.name} {t.datatype} dims {list(t.dims)}"
        for kind, t in _tensors(interface.inputs, interface.outputs)
    ]
    if tokenizer is None:
        config["inputs"] = tensor_entries(interface.inputs)
        config["outputs"] = tensor_entries(interface.outputs)
    else:
        text = text_interface(graph, interface)
        _check_tokenizer(tokenizer, max_length)
        if TOKENIZER_FILE in extra:
            raise ModelAddError(f"{path}: external data named {TOKENIZER_FILE} is not supported")
        extra[TOKENIZER_FILE] = tokenizer
        config["inputs"] = tensor_entries(text.inputs)
        config["outputs"] = tensor_entries(text.outputs)
        config["compute"] = {
            "inputs": tensor_entries(text.compute_inputs),
            "outputs": tensor_entries(text.compute_outputs),
            "pad": {t.name: 0 for t in text.compute_inputs},
        }
        config["tokenize"] = {"tokenizer": TOKENIZER_FILE, "max_length": max_length}
        if text.pool_source:
            mask = text.compute_inputs[1].name
            output = next(t.name for t in text.outputs if t not in text.compute_outputs)
            config["pool"] = {"source": text.pool_source, "mask": mask, "output": output}
            pooled = f"{text.pool_source} mean-pooled (by {mask}) into {output}"
        else:
            pooled = "outputs as the graph gives them (no [batch, tokens, H] output to pool)"
        lines = [
            f"text model: input text BYTES dims [1], tokenized by {tokenizer.name} "
            f"(max_length {max_length}); {pooled}",
            *(f"compute {line}" for line in lines),
            *(f"output {t.name} {t.datatype} dims {list(t.dims)}" for t in text.outputs),
        ]
    if interface.max_batch_size > 0:
        config["batching"] = {"max_batch_wait_ms": 2}
    return ModelDraft(
        name=name,
        config=config,
        versions=(VersionSource(version, path, extra),),
        header=(
            f"Generated by `tiermesh models add` from {path.resolve()}.",
            "Interface and batching read from the ONNX graph; edit freely.",
        ),
        summary=(*lines, f"batching: {interface.why}"),
    )


def _tensors(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> list[tuple[str, TensorSpec]]:
    return [("input", t) for t in inputs] + [("output", t) for t in outputs]


def _check_tokenizer(path: Path, max_length: int) -> None:
    from tiermesh.core.text import TextEncoder

    try:
        TextEncoder(path, max_length)
    except Exception as exc:  # the tokenizers library raises its own Exception types
        raise ModelAddError(
            f"{path}: not a tokenizer.json the tokenizers library reads ({one_line(str(exc))})"
        ) from None


def add_model(root: Path, draft: ModelDraft, force: bool = False) -> Added:
    """Write `draft` into the repository at `root` (created when missing) as
    root/<name>/: files copied, sha256s recorded, config.yaml written, loaded and run once.
    A model of that name already there is refused unless `force` (then replaced, and
    restored when the new one fails). ModelAddError / RepositoryError leave `root` as it was."""
    if not NAME.match(draft.name):
        raise ModelAddError(f"model name {draft.name!r} must match {NAME.pattern}")
    target = root / draft.name
    if target.exists() and not force:
        raise ModelAddError(
            f"model {draft.name!r} exists already ({target}); give another --name, or "
            "--force to replace it"
        )
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{draft.name}.adding.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        folder = staging / draft.name
        files = _copy(draft, folder)
        (folder / "config.yaml").write_text(render(draft, files))
        ran = _prove(staging, draft.name)
        _install(root, folder, target, staging / "replaced")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Added(target, files, ran)


def _copy(draft: ModelDraft, folder: Path) -> dict[str, dict[str, str]]:
    files: dict[str, dict[str, str]] = {}
    for source in draft.versions:
        dest = folder / source.version
        sums: dict[str, str] = {}
        for name, path in {MODEL_FILE: source.model, **source.extra}.items():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / name)
            sums[name] = sha256_file(dest / name)
        files[source.version] = sums
    return files


def render(draft: ModelDraft, files: Mapping[str, Mapping[str, str]]) -> str:
    """config.yaml's text: the header as comments, then each section (tensors one per
    line, in flow style, as the committed configs write them), then the versions."""
    lines = [f"# {h}" for h in draft.header]
    for key, value in draft.config.items():
        if key in draft.comments:
            lines.append(f"# {draft.comments[key]}")
        lines += _entry(key, value, "")
    lines.append("versions:")
    for version, sums in files.items():
        lines.append(f"  {_flow(version)}:")
        lines += [f"    {_flow(name)}: {digest}" for name, digest in sums.items()]
    return "\n".join(lines) + "\n"


def _entry(key: str, value: Any, indent: str) -> list[str]:
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [f"{indent}{key}:", *(f"{indent}  - {_flow(v)}" for v in value)]
    if isinstance(value, dict) and any(isinstance(v, list | dict) for v in value.values()):
        if any(isinstance(v, list) and v and isinstance(v[0], dict) for v in value.values()):
            out = [f"{indent}{key}:"]
            for k, v in value.items():
                out += _entry(k, v, indent + "  ")
            return out
    return [f"{indent}{_flow(key)}: {_flow(value)}"]


def _flow(value: Any) -> str:
    """One YAML value on one line (flow style, quoted where YAML needs it)."""
    text = yaml.safe_dump([value], default_flow_style=True, sort_keys=False, width=1 << 30)
    return text.strip()[1:-1]


def _prove(staging: Path, name: str) -> dict[str, str]:
    """Load the staged model through the repository (config, checksums, external data) and
    run each version once; the run of each, in words."""
    repo = ModelRepository(staging)
    cfg = repo.load()[name]
    return {v.version: _run_once(repo, cfg, v.version) for v in cfg.versions}


def _run_once(repo: ModelRepository, cfg: ModelConfig, version: str) -> str:
    from tiermesh.core.sessions import open_session, session_options

    model = repo.verified_model(cfg.name, version)
    where = f"{model.path.name} (version {version})"
    try:
        options = session_options(0)
        options.log_severity_level = 4  # a probe size the model cannot take is no news
        session = open_session(model.data, options, external=model.external).session
    except Exception as exc:  # onnxruntime's own exception types
        raise ModelAddError(f"onnxruntime cannot load {where}: {_first(exc)}") from None
    outputs = [t.name for t in cfg.runs_outputs]
    errors: list[str] = []
    for feeds in _probe_feeds(repo, cfg, version):
        try:
            got = session.run(outputs, feeds)
        except Exception as exc:  # onnxruntime's own exception types
            errors.append(_first(exc))
            continue
        shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
        batch = (DYNAMIC,) if cfg.max_batch_size > 0 else ()
        for spec, array in zip(cfg.runs_outputs, got, strict=True):
            if not shape_fits(batch + spec.dims, array.shape):
                raise ModelAddError(
                    f"{where}: output {spec.name} came out as {list(array.shape)} on inputs "
                    f"{shapes}; the config says {list(batch + spec.dims)}"
                )
        done = ", ".join(f"{n} {list(np.shape(a))}" for n, a in zip(outputs, got, strict=True))
        return f"ran on {shapes} -> {done}"
    tried = (
        "a short and a long text"
        if cfg.tokenize
        else (f"dynamic dimensions of {', '.join(map(str, PROBE_SIZES))}")
    )
    raise ModelAddError(
        f"{where} does not run on zeros of its declared shapes (tried {tried}): {errors[0]}; "
        "nothing was added"
    )


def _probe_feeds(
    repo: ModelRepository, cfg: ModelConfig, version: str
) -> list[dict[str, npt.NDArray[Any]]]:
    rows = min(PROBE_ROWS, cfg.max_batch_size)
    if cfg.tokenize is None:
        return [zeros(cfg.runs_inputs, rows, size) for size in PROBE_SIZES]
    from tiermesh.core.text import TextEncoder

    file = cfg.tokenize.tokenizer_file
    folder = repo.checked_files(cfg.name, [file], version)
    encoded = TextEncoder(folder / file, cfg.tokenize.max_length).encode(
        ["tiermesh", "word " * cfg.tokenize.max_length][:rows]
    )
    return [{TOKEN_IDS: encoded.input_ids, TOKEN_MASK: encoded.attention_mask}]


def _first(exc: BaseException, limit: int = 400) -> str:
    """An exception's message as one line of at most `limit` characters."""
    text = one_line(str(exc)) or repr(exc)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line(text: str) -> str:
    return " ".join(text.split())


def _install(root: Path, folder: Path, target: Path, aside: Path) -> None:
    """Move the proven model into place (a model it replaces into `aside`, inside the
    staging folder, until the repository loads with the new one); RepositoryError, with
    everything restored, when it does not."""
    backup = aside / target.name
    if target.exists():
        aside.mkdir(parents=True)
        os.rename(target, backup)
    os.rename(folder, target)
    try:
        ModelRepository(root).load()
    except RepositoryError as exc:
        shutil.rmtree(target)
        if backup.exists():
            os.rename(backup, target)
        raise RepositoryError(
            f"the repository does not load with model {target.name!r} in it, so it was not "
            f"added: {exc}"
        ) from None
