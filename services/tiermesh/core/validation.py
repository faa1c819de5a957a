"""What a model takes, checked of tensors: names, datatypes, shapes, contents, limits. Pure;
used by the gateway (each door's requests) and the router (jobs from a peer it does not
authenticate: check_job), raising INVALID_ARGUMENT that names the problem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import grpc

from tiermesh.core.errors import MeshError, invalid, shown, shown_shape
from tiermesh.core.jobs import Job
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tenants import Tenant
from tiermesh.core.tensors import BYTES, TensorData, element_count, split_bytes, validate_raw

# Called by a door with each input's name, datatype and shape before it reads the input's
# contents: the data plane's check_tensor against the model, so that a tensor the model would
# refuse is never built.
Screen = Callable[[str, str, tuple[int, ...]], None]


def no_screen(name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """A Screen that lets every tensor through (validate checks it later)."""


# Elements the gateway walks one by one (typed contents, BYTES elements), ~40 ns each: at
# most ~40 ms of the event loop a tensor. Fixed-size tensors sent raw have no such limit.
MAX_LISTED_ELEMENTS = 1 << 20


def check_tensor(cfg: ModelConfig, name: str, datatype: str, shape: tuple[int, ...]) -> None:
    """What can be said of an input from its name, datatype and shape alone, before its
    contents are read (or, for typed contents, even built): raise INVALID_ARGUMENT."""
    spec = cfg.input(name)
    if spec is None:
        known = ", ".join(i.name for i in cfg.inputs)
        raise invalid(f"unknown input '{shown(name)}' for model '{cfg.name}' (inputs: {known})")
    if datatype != spec.datatype:
        raise invalid(
            f"input '{shown(name)}': datatype {shown(datatype)} does not match the model's "
            f"{spec.datatype}"
        )
    _check_shape(cfg, name, shape, spec.dims)
    if datatype == BYTES and (count := element_count(shape)) > MAX_LISTED_ELEMENTS:
        raise invalid(
            f"input '{shown(name)}': {count} BYTES elements, over the limit of "
            f"{MAX_LISTED_ELEMENTS}"
        )


def _check_shape(
    cfg: ModelConfig, name: str, shape: tuple[int, ...], expected_dims: tuple[int, ...]
) -> None:
    if any(d < 1 for d in shape):
        raise invalid(
            f"input '{shown(name)}': every dimension must be positive, got {shown_shape(shape)}"
        )
    dims = shape
    if cfg.max_batch_size > 0:
        if len(shape) != len(expected_dims) + 1:
            raise invalid(
                f"input '{shown(name)}': rank {len(shape)} does not match the model's rank "
                f"{len(expected_dims) + 1} (shape {[-1, *expected_dims]})"
            )
        if shape[0] > cfg.max_batch_size:
            raise invalid(
                f"input '{shown(name)}': batch size {shape[0]} exceeds max_batch_size "
                f"{cfg.max_batch_size}"
            )
        dims = shape[1:]
    elif len(shape) != len(expected_dims):
        raise invalid(
            f"input '{shown(name)}': rank {len(shape)} does not match the model's rank "
            f"{len(expected_dims)} (shape {list(expected_dims)})"
        )
    for i, (got, want) in enumerate(zip(dims, expected_dims, strict=True)):
        if want != -1 and got != want:
            raise invalid(
                f"input '{shown(name)}': dimension {i + (cfg.max_batch_size > 0)} is {got}, "
                f"the model expects {want}"
            )
    if cfg.max_sequence:
        offset = 1 if cfg.max_batch_size > 0 else 0
        for i, want in enumerate(expected_dims):
            if want == -1 and shape[i + offset] > cfg.max_sequence:
                raise invalid(
                    f"input '{shown(name)}': dimension {i + offset} is {shape[i + offset]}, "
                    f"longer than the model's {cfg.max_sequence}"
                )


def _check_text_limit(cfg: ModelConfig, t: TensorData) -> None:
    """A tokenized model's limit on the byte size of each text."""
    if cfg.tokenize is not None and t.datatype == BYTES:
        limit = cfg.tokenize.max_text_bytes
        for i, item in enumerate(split_bytes(t.raw, element_count(t.shape), t.name)):
            if len(item) > limit:
                raise invalid(
                    f"input '{shown(t.name)}': text element {i} is {len(item)} bytes, over the "
                    f"limit of {limit}"
                )


def check_inputs(cfg: ModelConfig, inputs: Sequence[TensorData]) -> None:
    """Raise INVALID_ARGUMENT for the first thing wrong with `inputs` for model `cfg`."""
    seen: set[str] = set()
    for t in inputs:
        check_tensor(cfg, t.name, t.datatype, t.shape)
        if t.name in seen:
            raise invalid(f"input '{shown(t.name)}' given more than once")
        seen.add(t.name)
        validate_raw(t.name, t.datatype, t.shape, t.raw)
        _check_text_limit(cfg, t)
    missing = [i.name for i in cfg.inputs if i.name not in seen]
    if missing:
        raise invalid(f"missing input(s) {', '.join(missing)} for model '{cfg.name}'")
    if cfg.max_batch_size > 0 and len({t.shape[0] for t in inputs}) > 1:
        raise invalid("inputs disagree on the batch size (dimension 0)")


def check_outputs(cfg: ModelConfig, names: Sequence[str]) -> None:
    """INVALID_ARGUMENT for a requested output the model does not have."""
    outputs = {o.name for o in cfg.outputs}
    for name in names:
        if name not in outputs:
            raise invalid(f"unknown output '{shown(name)}' for model '{cfg.name}'")


def check_job(cfg: ModelConfig, job: Job, tenants: Mapping[str, Tenant] | None) -> None:
    """A job from a peer whose identity no certificate proves (internal mTLS off): what its
    gateway checked, checked again. Its tenant must be one of the tenants file (`tenants`)
    that may use the model, or none where the mesh has no tenants file (None); its tensors
    and outputs must be the model's. PERMISSION_DENIED or INVALID_ARGUMENT."""
    if tenants is None:
        if job.tenant:
            raise MeshError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"job names tenant '{shown(job.tenant)}', and this mesh has no tenants",
            )
    else:
        tenant = tenants.get(job.tenant)
        if tenant is None or not tenant.may_use(cfg.name):
            raise MeshError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"job of tenant '{shown(job.tenant)}' for model '{cfg.name}': no such tenant may",
            )
    check_inputs(cfg, job.inputs)
    check_outputs(cfg, job.requested_outputs)
