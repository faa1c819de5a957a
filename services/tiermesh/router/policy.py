"""Pure routing decisions: which stream a job goes to. No gRPC, no Redis, no clock."""

from __future__ import annotations

import bisect

from tiermesh.core.jobs import Job
from tiermesh.core.keys import StreamKey, compute_unit
from tiermesh.core.repository import ModelConfig

DEFAULT_TIER = "center"


def job_length(job: Job, batched: bool = True) -> int:
    """The length a job is bucketed by: its longest dimension over all inputs, leaving out
    the batch dimension when the model batches."""
    skip = 1 if batched else 0
    return max((max(t.shape[skip:], default=1) for t in job.inputs), default=1)


def bucket_for(length: int, bounds: tuple[int, ...]) -> int:
    """Index of the first bucket whose upper bound is >= length; the last bucket catches
    everything longer. With no bounds there is one bucket, 0."""
    if not bounds:
        return 0
    return min(bisect.bisect_left(bounds, length), len(bounds) - 1)


def choose_stream(cfg: ModelConfig, job: Job, tier: str = DEFAULT_TIER) -> StreamKey:
    """The stream of (compute unit, tier, priority, length bucket) for a validated job; a
    job without a version (not yet placed) goes to the model's default version."""
    priority = min(max(job.priority or cfg.default_priority, 1), cfg.priority_levels)
    length = job_length(job, batched=cfg.max_batch_size > 0)
    unit = compute_unit(
        cfg.queue_model, job.variant or cfg.default_variant, job.version or cfg.stable.version
    )
    return StreamKey(unit, tier, priority, bucket_for(length, cfg.length_buckets))
