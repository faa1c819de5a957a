"""Every Redis key and stream name of the mesh. Nothing else spells them.

Work streams: ``tm:q:{name}@version.variant:tier:p<priority>:b<bucket>``, one consumer group
per stream, where ``name@version.variant`` is a compute unit (``minilm-l6@1.int8``).

Keys that one command, transaction or script uses together share a Redis Cluster hash tag
(the part in braces), so they live in one slot on one node: every key of a model's work (its
units' streams, worker sets, drain rates, dead letters, enqueue records), its response cache
and its statistics are tagged with the model's name; a tenant's quota with the tenant; the
rollouts, the model control and the batch jobs' bookkeeping each with a tag of their own.
Keys that are only ever used one at a time (cancel flags, the audit and capture streams)
carry none and spread over the cluster. On a single Redis the braces are only characters.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiermesh.core.compute_unit import ComputeUnit

PREFIX = "tm"
# The tier of a model without tiers: its streams and workers are named under it.
DEFAULT_TIER = "center"
GROUP = "workers"
# Field names inside a stream entry.
JOB_FIELD = "job"
TRACEPARENT_FIELD = "traceparent"
TRACESTATE_FIELD = "tracestate"


def model_tag(model: str) -> str:
    """The hash tag of every key of a model's work: its name in braces."""
    return "{" + model + "}"


@dataclass(frozen=True, slots=True)
class StreamKey:
    unit: ComputeUnit
    tier: str
    priority: int
    bucket: int

    @property
    def name(self) -> str:
        return f"{PREFIX}:q:{self.unit.tagged}:{self.tier}:p{self.priority}:b{self.bucket}"

    @classmethod
    def parse(cls, name: str) -> StreamKey:
        """Inverse of :attr:`name`; raises ValueError on a name not made by this module."""
        parts = name.split(":")
        if len(parts) != 6 or parts[0] != PREFIX or parts[1] != "q":
            raise ValueError(f"not a tiermesh work stream: {name!r}")
        if not parts[4].startswith("p") or not parts[5].startswith("b"):
            raise ValueError(f"not a tiermesh work stream: {name!r}")
        try:
            unit = ComputeUnit.parse_tagged(parts[2])
        except ValueError:
            raise ValueError(f"not a tiermesh work stream: {name!r}") from None
        return cls(unit, parts[3], int(parts[4][1:]), int(parts[5][1:]))


def workers_key(unit: ComputeUnit, tier: str) -> str:
    """Sorted set of live worker ids for (unit, tier), scored by heartbeat expiry (ms)."""
    return f"{PREFIX}:workers:{unit.tagged}:{tier}"


def provider_key(unit: ComputeUnit, tier: str, worker: str) -> str:
    """The execution provider one worker's session of (model, tier) got (`worker` as in the
    worker set), expiring with the heartbeat that last wrote it."""
    return f"{PREFIX}:provider:{unit.tagged}:{tier}:{worker}"


def rate_key(unit: ComputeUnit, tier: str) -> str:
    """Hash of measured drain rates (entries per second of compute), field b{bucket}."""
    return f"{PREFIX}:rate:{unit.tagged}:{tier}"


def rate_field(bucket: int) -> str:
    return f"b{bucket}"


def dead_letter_key(unit: ComputeUnit, tier: str) -> str:
    """Stream of entries given up on after too many deliveries (kept for inspection)."""
    return f"{PREFIX}:dlq:{unit.tagged}:{tier}"


def cancel_key(request_id: str) -> str:
    """Set (with a TTL) when a caller gave up: workers skip the request if not yet computed."""
    return f"{PREFIX}:cancel:{request_id}"


def enqueued_key(model: str, request_id: str) -> str:
    """Entry id a request was queued under (with a TTL): a retried enqueue of the same
    request finds it and is not queued twice. In its model's slot, with the streams the
    admission script queues it on."""
    return f"{PREFIX}:enq:{model_tag(model)}:{request_id}"


def stream_keys(
    unit: ComputeUnit, tier: str, priority_levels: int, buckets: int
) -> list[StreamKey]:
    """All work streams of one unit on one tier, highest priority (1) first."""
    return [
        StreamKey(unit, tier, p, b) for p in range(1, priority_levels + 1) for b in range(buckets)
    ]


# The gateway's response cache, per public model: one string per answer, and an index of the
# answers' digests scored by insertion time, so the cache can keep to its bound.


def cache_entry_prefix(model: str) -> str:
    """What every response-cache entry key of `model` starts with (SCAN with prefix + "*")."""
    return f"{PREFIX}:cache:{model_tag(model)}:e:"


def cache_entry_key(model: str, digest: str) -> str:
    """String holding one cached answer (a serialized internal Result), expiring by TTL."""
    return cache_entry_prefix(model) + digest


def cache_index_key(model: str) -> str:
    """Sorted set of the digests cached for `model`, scored by insertion time (ms)."""
    return f"{PREFIX}:cache:{model_tag(model)}:index"


# Per-tenant quotas, shared by every gateway replica. The tenant sits in braces, a Redis
# Cluster hash tag, so both keys of a tenant live on one node and one script can use both.


def quota_rate_key(tenant: str) -> str:
    """Hash of the tenant's token bucket (fields `tokens`, `ms`); expires once full again."""
    return f"{PREFIX}:quota:{{{tenant}}}:rate"


def quota_in_flight_key(tenant: str) -> str:
    """Sorted set of the tenant's request ids in flight, scored by their deadline (ms), so
    the entries of a gateway that died expire by themselves."""
    return f"{PREFIX}:quota:{{{tenant}}}:inflight"


# Who called what with which outcome: one entry per ModelInfer on an authenticated port.
# Unlike the work streams it is trimmed (approximate MAXLEN): it is a record, not work.
AUDIT_STREAM = f"{PREFIX}:audit"


# Canary rollouts. Per model a hash of its rollout state (rollout/state.py has the fields),
# written by `tiermesh rollout` and the controller, read by routers about once a second.
# Written in one script with the change log: one hash tag for both.
_ROLLOUTS = f"{PREFIX}:{{rollout}}"


def rollout_key(model: str) -> str:
    return f"{_ROLLOUTS}:{model}"


# Held (SET NX PX) by the one router whose controller evaluates rollouts right now.
ROLLOUT_LOCK = f"{_ROLLOUTS}:lock"
# Every change of a model's version or rollout: who, what, when, checksum. Changes are rare
# and the record is the point: trimmed only past about CHANGE_LOG_MAX_LEN entries (no key
# the mesh writes grows without a bound).
CHANGE_LOG = f"{_ROLLOUTS}:changes"
CHANGE_LOG_MAX_LEN = 10_000


def window_key(model: str, version: str, second: int) -> str:
    """Hash of what the gateways saw of (model, version) in one second (unix s): answers by
    status code, a latency histogram, output-drift sums. Expires (rollout/window.py)."""
    return f"{PREFIX}:win:{model}:{version}:{second}"


# Model control (Triton's explicit mode): the set of models ("{model}") and model versions
# ("{model}:{version}") unloaded through RepositoryModelUnload. What the mesh serves is every
# model of the repository folder minus this set; gateways refuse, routers stop routing and
# workers close the sessions of what it holds.
UNLOADED_MODELS = f"{PREFIX}:{{control}}:unloaded"
# Incremented (in the same transaction) by every load and unload: every service polls it and
# re-reads the set and the repository folder when it changed (core/control_watch.py).
CONTROL_GENERATION = f"{PREFIX}:{{control}}:generation"


def stats_key(model: str, version: str) -> str:
    """Hash of Triton's ModelStatistics figures of (model, version), summed over every
    gateway replica: each adds what it counted since its last flush (gateway/statistics.py)."""
    return f"{PREFIX}:stats:{model_tag(model)}:{version}"


def stats_batch_key(model: str, worker: str, batch_start_ns: int) -> str:
    """Set (NX, with a TTL) by the first gateway that flushes a batch's figures: a batch
    whose requests came through several gateways counts once. In the slot of the model's
    statistics, which the same script adds to."""
    return f"{PREFIX}:stats:{model_tag(model)}:batch:{worker}:{batch_start_ns}"


# Traffic capture (gateway/capture.py): one record per sampled request, shapes only; trimmed
# (approximate MAXLEN) like the audit stream. The control hash (`rate`, `until_ms`) is set
# by `tiermesh bench capture start|stop` and read by every gateway's capture writer.
CAPTURE_STREAM = f"{PREFIX}:capture"
CAPTURE_CONTROL = f"{PREFIX}:capture:control"


def capture_content_key(request_id: str) -> str:
    """String (with a TTL) holding one captured request's inputs, encrypted; only for
    tenants whose contents capture is enabled."""
    return f"{PREFIX}:capture:content:{request_id}"


# Offline batch jobs (batch/store.py). Their bookkeeping (records, inputs, results, the open
# and active sets, the feeder's lock) is written by scripts that span a job and the sets: one
# hash tag for all of it. A job's work goes through the background streams of its compute
# unit: priority level 0, below every online level (1 is the highest), one per (tier,
# bucket); the scheduler takes them only in the gaps of online work.
_BATCH = f"{PREFIX}:{{batch}}"
BACKGROUND_PRIORITY = 0


def background_streams(unit: ComputeUnit, tier: str, buckets: int) -> list[StreamKey]:
    """The background streams of one compute unit on one tier, one per length bucket."""
    return [StreamKey(unit, tier, BACKGROUND_PRIORITY, b) for b in range(buckets)]


def batch_job_key(job_id: str) -> str:
    """Hash of one job's record: owner, model, status, counts, feed cursor, times."""
    return f"{_BATCH}:job:{job_id}"


def batch_inputs_key(job_id: str) -> str:
    """List of the job's inputs, by index (each a serialized internal Job with inputs only)."""
    return f"{_BATCH}:job:{job_id}:in"


def batch_results_key(job_id: str) -> str:
    """Hash of the job's results, field = input index, written once (HSETNX)."""
    return f"{_BATCH}:job:{job_id}:out"


def batch_open_key(tenant: str) -> str:
    """Set of the ids of a tenant's unfinished jobs ("" = the unauthenticated port's), at
    most its open-jobs cap of them; ended ones are pruned when it is reached."""
    return f"{_BATCH}:open:{tenant}"


# Set of the ids of jobs whose inputs are still being fed onto the queues.
BATCH_ACTIVE = f"{_BATCH}:active"
# Held (SET NX PX) by the one router whose feeder moves job inputs onto the queues.
BATCH_FEED_LOCK = f"{_BATCH}:feed:lock"
