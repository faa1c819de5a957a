"""Pure routing decisions: which stream a job goes to, what a refusal says. No gRPC, no
Redis, no clock."""

from __future__ import annotations

import grpc

from tiermesh.core.errors import MeshError, exhausted, unavailable
from tiermesh.core.jobs import Job
from tiermesh.core.keys import DEFAULT_TIER, StreamKey, stream_keys
from tiermesh.core.model_config import bucket_for
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tier_spec import TierSpec
from tiermesh.router.admission import Admission


def job_length(job: Job, batched: bool = True) -> int:
    """The length a job is bucketed by: its longest dimension over all inputs, leaving out
    the batch dimension when the model batches."""
    skip = 1 if batched else 0
    return max((max(t.shape[skip:], default=1) for t in job.inputs), default=1)


def choose_stream(cfg: ModelConfig, job: Job, tier: str = DEFAULT_TIER) -> StreamKey:
    """The stream of (compute unit, tier, priority, length bucket) for a validated job; a
    job without a version (not yet placed) goes to the model's default version."""
    priority = cfg.priority_level(job.priority)
    length = job_length(job, batched=cfg.max_batch_size > 0)
    unit = cfg.unit(cfg.version_for(job.version), cfg.variant_for(job.variant))
    return StreamKey(unit, tier, priority, bucket_for(length, cfg.length_buckets))


def model_streams(cfg: ModelConfig, stream: StreamKey) -> list[StreamKey]:
    """Every stream of the stream's compute unit on its tier (for the model-wide bound)."""
    if cfg.model_queue_bound <= 0:
        return []
    return stream_keys(stream.unit, stream.tier, cfg.priority_levels, cfg.bucket_count)


def refusal(cfg: ModelConfig, admission: Admission, retry_after_ms: int) -> MeshError:
    """The status a refused admission answers with (DESIGN.md's table)."""
    if admission.outcome == "noworker":
        return unavailable(f"no live worker for model '{cfg.name}'")
    if admission.outcome == "late":
        return MeshError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the queue ahead needs ~{admission.detail} ms, more than the request's deadline "
            "leaves",
            retry_after_ms=int(admission.detail),
        )
    what = "queue" if admission.outcome == "full" else "model's queues"
    bound = cfg.queue_bound if admission.outcome == "full" else cfg.model_queue_bound
    return exhausted(
        f"{what} for model '{cfg.name}' full ({admission.detail} waiting, bound {bound}); "
        "retry later",
        retry_after_ms,
    )


def job_cost(cfg: ModelConfig, job: Job) -> int:
    """What a request costs to compute, for tier choice: rows x length (tokens for text)."""
    return job.rows * job_length(job, batched=cfg.max_batch_size > 0)


def tier_stream(cfg: ModelConfig, job: Job, tier: TierSpec) -> StreamKey:
    """The stream the job would join on `tier`."""
    variant = cfg.variant_for(job.variant, tier)
    return choose_stream(cfg, job.with_(variant=variant), tier.name)
