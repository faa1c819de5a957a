"""Pure decisions about batch jobs: the job record's form, how much to feed onto the queue
next, progress and ETA, and the job's summary figures. No Redis, no gRPC, no clock."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from tiermesh.core.keys import DEFAULT_TIER, StreamKey, background_streams
from tiermesh.core.model_config import ModelConfig

# Job statuses: loading (inputs arriving) -> queued (sealed, nothing fed yet) -> running
# -> done; cancelled from any of them.
LOADING, QUEUED, RUNNING, DONE, CANCELLED = "loading", "queued", "running", "done", "cancelled"
FINISHED = frozenset({DONE, CANCELLED})


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job as its Redis hash holds it (batch/store.py)."""

    job_id: str
    tenant: str
    model: str
    variant: str
    status: str
    total: int
    fed: int  # the feed cursor: inputs [0, fed) are on a queue or done
    done: int  # results written with status OK
    errors: int  # results written with an error status
    created_ms: int
    finished_ms: int = 0
    tier: str = ""  # the tier its work is pinned to ("" = the model's bulk tier)
    version: str = ""

    @property
    def finished(self) -> int:
        """Inputs whose result is written, whatever its status."""
        return self.done + self.errors

    @property
    def in_queue(self) -> int:
        """Inputs fed and not yet finished: what sits on (or is read from) the queues."""
        return max(self.fed - self.finished, 0)

    def fields(self) -> dict[str, str]:
        return {
            "job_id": self.job_id,
            "tenant": self.tenant,
            "model": self.model,
            "variant": self.variant,
            "status": self.status,
            "total": str(self.total),
            "fed": str(self.fed),
            "done": str(self.done),
            "errors": str(self.errors),
            "created_ms": str(self.created_ms),
            "finished_ms": str(self.finished_ms),
            "tier": self.tier,
            "version": self.version,
        }

    @classmethod
    def from_fields(cls, raw: Mapping[str, str]) -> JobRecord:
        def num(name: str) -> int:
            return int(raw.get(name) or 0)

        return cls(
            job_id=raw.get("job_id", ""),
            tenant=raw.get("tenant", ""),
            model=raw.get("model", ""),
            variant=raw.get("variant", ""),
            status=raw.get("status", LOADING),
            total=num("total"),
            fed=num("fed"),
            done=num("done"),
            errors=num("errors"),
            created_ms=num("created_ms"),
            finished_ms=num("finished_ms"),
            tier=raw.get("tier", ""),
            version=raw.get("version", ""),
        )


def feed_count(job: JobRecord, max_queued: int, chunk: int) -> int:
    """How many inputs to move onto the queue now: the next chunk, cut so that no more than
    `max_queued` of the job's inputs wait at once (the queue never holds the whole job),
    and none past the end, nor any for a job not (or no longer) runnable."""
    if job.status not in (QUEUED, RUNNING):
        return 0
    room = max_queued - job.in_queue
    return max(0, min(chunk, room, job.total - job.fed))


def background_tier(cfg: ModelConfig, pinned: str = "") -> str:
    """The tier a job's work goes to: the configured pin when the model has that tier,
    else its last tier (the one that takes every size), else the default tier."""
    names = [t.name for t in cfg.tiers]
    if pinned and (pinned in names or not names):
        return pinned
    return names[-1] if names else DEFAULT_TIER


def job_streams(cfg: ModelConfig, job: JobRecord) -> list[StreamKey]:
    """Every background stream the job's inputs may be queued on (all tiers, buckets)."""
    variants = [job.variant] if job.variant else sorted(cfg.variants)
    versions = [job.version] if job.version else [v.version for v in cfg.versions]
    units = [cfg.unit(v, a) for a in variants for v in versions]
    tiers = [t.name for t in cfg.tiers] or [job.tier or DEFAULT_TIER]
    return [s for u in units for t in tiers for s in background_streams(u, t, cfg.bucket_count)]


def request_id(job_id: str, index: int) -> str:
    """The request id of one input of a job on the queue (and in the worker's spans)."""
    return f"{job_id}:{index}"


def parse_request_id(rid: str) -> tuple[str, int]:
    """(job id, input index) of a request id made by `request_id`; ValueError otherwise."""
    job_id, sep, index = rid.rpartition(":")
    if not sep or not job_id or not index.isdigit():
        raise ValueError(f"not a batch request id: {rid!r}")
    return job_id, int(index)


def eta_s(job: JobRecord, rate_per_s: float) -> float | None:
    """Seconds until every input is finished at the measured drain rate; None when the
    rate is unknown (nothing finished yet), 0 when finished."""
    left = job.total - job.finished
    if left <= 0:
        return 0.0
    if rate_per_s <= 0:
        return None
    return left / rate_per_s


@dataclass(frozen=True, slots=True)
class Summary:
    inputs: int
    errors: int
    wall_s: float
    per_hour: float


def summary(job: JobRecord, now_ms: int) -> Summary:
    """A job's figures: wall time from submission to its end (or now), sequences per hour."""
    end = job.finished_ms or now_ms
    wall_s = max(end - job.created_ms, 0) / 1000
    per_hour = job.finished / wall_s * 3600 if wall_s > 0 else 0.0
    return Summary(job.total, job.errors, wall_s, per_hour)


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float:
    """The q-quantile of a Prometheus histogram given as cumulative counts by upper bound
    (+inf included), interpolated within its bucket as Prometheus does; NaN when empty."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return bounds[-1]


_BUCKET = re.compile(r'^(\w+)_bucket\{(?:[^}]*,)?le="([^"]+)"[^}]*\}\s+(\S+)')


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative counts by upper bound of Prometheus histogram `name` in exposition `text`,
    summed over every label set (every model, tier, priority...)."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        m = _BUCKET.match(line)
        if m and m.group(1) == name:
            le = float(m.group(2))
            out[le] = out.get(le, 0.0) + float(m.group(3))
    return out


def bucket_delta(before: Mapping[float, float], after: Mapping[float, float]) -> dict[float, float]:
    """What a histogram counted between two scrapes."""
    return {le: after[le] - before.get(le, 0.0) for le in after}
