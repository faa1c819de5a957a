"""Turning a batch's onnxruntime outputs into per-request results."""

from __future__ import annotations

import grpc

from tiermesh.core.jobs import Job, JobResult
from tiermesh.core.model_config import ModelConfig
from tiermesh.core.tensors import TensorData, element_count
from tiermesh.worker.batching import QueuedJob
from tiermesh.worker.runner import JobOutputs


def computed(
    cfg: ModelConfig, q: QueuedJob, out: JobOutputs, start: int, end: int, rows: int, worker: str
) -> JobResult:
    return JobResult.for_job(
        q.job,
        worker=worker,
        outputs=_public(cfg, q.job, out.outputs),
        aux=_aux(cfg, out.outputs, out.padded_inputs),
        timing=q.job.timing.with_(batch_start_ns=start, batch_end_ns=end),
        batch_size=rows,
        annotations={**q.job.annotations, **_padding(cfg, q.job, out.padded_inputs)},
    )


def _padding(cfg: ModelConfig, job: Job, padded: tuple[TensorData, ...]) -> dict[str, str]:
    """Elements of the first padded input as sent and as run: padding waste, measurable."""
    name = next(iter(cfg.pad), None)
    if name is None:
        return {}
    sent = next((t for t in job.inputs if t.name == name), None)
    ran = next((t for t in padded if t.name == name), None)
    if sent is None or ran is None:
        return {}
    return {
        "tokens": str(element_count(sent.shape)),
        "padded_tokens": str(element_count(ran.shape)),
    }


def failed(q: QueuedJob, code: grpc.StatusCode, message: str) -> JobResult:
    return JobResult.for_job(q.job, code=code, message=message)


def _public(cfg: ModelConfig, job: Job, outputs: tuple[TensorData, ...]) -> tuple[TensorData, ...]:
    """Outputs the caller asked for; a model that postprocesses hands on all of them."""
    if cfg.compute_outputs or not job.requested_outputs:
        return outputs
    return tuple(o for o in outputs if o.name in job.requested_outputs)


def _aux(
    cfg: ModelConfig, outputs: tuple[TensorData, ...], padded: tuple[TensorData, ...]
) -> tuple[TensorData, ...]:
    """The inputs a postprocess step needs (the pooling mask), as padded for the batch; none
    when onnxruntime pooled already (the token vectors are not among the outputs)."""
    if cfg.pool is None or not any(o.name == cfg.pool.source for o in outputs):
        return ()
    return tuple(t for t in padded if t.name == cfg.pool.mask)
