"""Triton's per-model statistics (the ModelStatistics extension), kept by the gateway from
the per-request timeline of every answer: the same instants the response parameters and
the Prometheus histograms are computed from (core/jobs.py `Timing`).

How the mesh's stages map onto Triton's fields (all durations cumulative, nanoseconds):

| Triton field     | tiermesh stages (response parameters)  | instants                      |
|------------------|----------------------------------------|-------------------------------|
| success          | total_ms                               | received -> responded         |
| compute_input    | preprocess_ms                          | received -> enqueued          |
| queue            | queue_ms + batch_wait_ms               | enqueued -> batch start       |
| compute_infer    | compute_ms                             | batch start -> batch end      |
| compute_output   | postprocess_ms                         | batch end -> postprocessed    |
| fail             | failed calls, received -> refused       |                               |
| cache_hit        | answers from the response cache         | received -> responded         |

| cache_miss       | answers not in the response cache       | the lookup and the write back |

compute_input covers what happens before the request can wait for a worker: the gateway's
checks, the hop to the router and its input processing (tokenization). execution_count
counts distinct batches (worker, batch start). batch_stats, per batch size: compute_infer
(batch start -> end) and compute_output (batch end -> postprocessed: postprocess takes a
whole batch in one call); compute_input stays 0 there, as the timeline has no batch-level
input stage (padding and concatenation run inside the compute span).

The figures are the whole mesh's: each gateway counts in memory (nothing per request leaves
the process) and adds what it counted to Redis every `statistics_flush_ms`, in one pipelined
round trip (gateway/statistics_store.py); ModelStatistics returns what Redis holds plus what
this gateway has not flushed yet. A batch is counted once even when its requests came
through several gateways (the first flush of it marks it in Redis).

Pure and synchronous; no gRPC, no Redis.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tiermesh.core.jobs import Timing

# Batches remembered per model version to count each one once (its requests arrive apart).
RECENT_BATCHES = 4096
DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        """`count` calls whose durations sum to `ns`."""
        self.count += count
        self.ns += max(0, ns)

    def merge(self, other: Duration) -> None:
        self.count += other.count
        self.ns += other.ns


@dataclass
class BatchStats:
    """Per batch size: the batches of that size and their compute and output time."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)

    def merge(self, other: BatchStats) -> None:
        self.compute_infer.merge(other.compute_infer)
        self.compute_output.merge(other.compute_output)


@dataclass(frozen=True, slots=True)
class Batch:
    """A batch first seen in this gateway's answers since the last flush."""

    worker: str
    start_ns: int
    size: int
    compute_infer_ns: int
    compute_output_ns: int


@dataclass
class VersionStatistics:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # Rows inferred (a request's batch dimension) and batches run.
    inference_count: int = 0
    execution_count: int = 0
    # Unix ms of the last answer (0: none yet).
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    # Batches not yet flushed (each also counted in execution_count and batches).
    new_batches: list[Batch] = field(default_factory=list)

    def duration(self, name: str) -> Duration:
        d = getattr(self, name)
        assert isinstance(d, Duration)
        return d

    def add_batch(self, batch: Batch) -> None:
        self.execution_count += 1
        per_size = self.batches.setdefault(batch.size, BatchStats())
        per_size.compute_infer.add(batch.compute_infer_ns)
        per_size.compute_output.add(batch.compute_output_ns)

    def merge(self, other: VersionStatistics) -> None:
        """Add `other`'s figures (its unflushed batches counted, not kept)."""
        for name in DURATIONS:
            self.duration(name).merge(other.duration(name))
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        self.last_inference_ms = max(self.last_inference_ms, other.last_inference_ms)
        for size, b in other.batches.items():
            self.batches.setdefault(size, BatchStats()).merge(b)


@dataclass(frozen=True, slots=True)
class StageNs:
    """One answer's timeline in Triton's terms (ns; see the table above)."""

    total: int
    compute_input: int
    queue: int
    compute_infer: int
    compute_output: int


def stage_ns(timing: Timing, responded_ns: int) -> StageNs:
    """The durations of an answer computed by a worker, built at `responded_ns`."""

    def span(start: int, end: int) -> int:
        return end - start if start and end else 0

    return StageNs(
        total=span(timing.received_ns, responded_ns),
        compute_input=span(timing.received_ns, timing.enqueued_ns),
        queue=span(timing.enqueued_ns, timing.batch_start_ns),
        compute_infer=span(timing.batch_start_ns, timing.batch_end_ns),
        compute_output=span(timing.batch_end_ns, timing.postprocessed_ns),
    )


Key = tuple[str, str]


class InferenceStatistics:
    """What this gateway counted per (model, version) since its last flush."""

    def __init__(self) -> None:
        self._pending: dict[Key, VersionStatistics] = {}
        # Drained, being written to Redis: still this gateway's to report until written.
        self._in_transit: dict[Key, VersionStatistics] = {}
        self._recent: OrderedDict[tuple[str, str, str, int], None] = OrderedDict()

    def _of(self, model: str, version: str) -> VersionStatistics:
        key = (model, version)
        if key not in self._pending:
            self._pending[key] = VersionStatistics()
        return self._pending[key]

    def _new_batch(self, model: str, version: str, batch: tuple[str, int]) -> bool:
        """True the first time a batch is seen (among the last RECENT_BATCHES)."""
        key = (model, version, *batch)
        if key in self._recent:
            return False
        self._recent[key] = None
        if len(self._recent) > RECENT_BATCHES:
            self._recent.popitem(last=False)
        return True

    def computed(
        self,
        model: str,
        version: str,
        rows: int,
        timing: Timing,
        responded_ns: int,
        batch: tuple[str, int],
        batch_size: int,
    ) -> None:
        """Called once per answer a worker computed, as its response is built."""
        stats = self._of(model, version)
        ns = stage_ns(timing, responded_ns)
        stats.success.add(ns.total)
        stats.compute_input.add(ns.compute_input)
        stats.queue.add(ns.queue)
        stats.compute_infer.add(ns.compute_infer)
        stats.compute_output.add(ns.compute_output)
        stats.inference_count += rows
        stats.last_inference_ms = max(stats.last_inference_ms, responded_ns // 1_000_000)
        if self._new_batch(model, version, batch):
            seen = Batch(batch[0], batch[1], batch_size, ns.compute_infer, ns.compute_output)
            stats.add_batch(seen)
            stats.new_batches.append(seen)

    def cache_hit(
        self, model: str, version: str, rows: int, received_ns: int, responded_ns: int
    ) -> None:
        """Called once per answer taken from the response cache."""
        stats = self._of(model, version)
        stats.success.add(responded_ns - received_ns)
        stats.cache_hit.add(responded_ns - received_ns)
        stats.inference_count += rows
        stats.last_inference_ms = max(stats.last_inference_ms, responded_ns // 1_000_000)

    def cache_miss(self, model: str, version: str, lookup_ns: int) -> None:
        """Called once per computed answer of a caching model: its lookup and write back."""
        self._of(model, version).cache_miss.add(lookup_ns)

    def failed(self, model: str, version: str, received_ns: int, ended_ns: int) -> None:
        """Called once per call to a known model that ended without an answer."""
        self._of(model, version).fail.add(ended_ns - received_ns)

    def failed_many(self, model: str, version: str, count: int, total_ns: int) -> None:
        """`count` such calls at once, their durations summed (the door's refusals)."""
        self._of(model, version).fail.add(total_ns, count)

    def of(self, model: str, version: str) -> VersionStatistics:
        """This gateway's figures of (model, version) not yet in Redis; zeros when none."""
        out = VersionStatistics()
        for part in (self._in_transit, self._pending):
            if (model, version) in part:
                out.merge(part[(model, version)])
        return out

    def drain(self) -> dict[Key, VersionStatistics]:
        """Hand the figures over for a flush; they still count in `of` until `flushed`."""
        drained, self._pending = self._pending, {}
        for key, stats in drained.items():
            self._in_transit.setdefault(key, VersionStatistics()).merge(stats)
        return drained

    def flushed(self, drained: dict[Key, VersionStatistics], ok: bool) -> None:
        """After a flush: written (forget them), or failed (count them again next time)."""
        self._in_transit = {}
        if ok:
            return
        for key, stats in drained.items():
            pending = self._of(*key)
            pending.merge(stats)
            pending.new_batches[:0] = stats.new_batches


def _duration_doc(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def model_stats_doc(model: str, version: str, stats: VersionStatistics) -> dict[str, object]:
    """One entry of Triton's statistics response, in its JSON shape (the REST body; the
    gRPC message is parsed from the same document)."""
    return {
        "name": model,
        "version": version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {name: _duration_doc(stats.duration(name)) for name in DURATIONS},
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration_doc(Duration()),
                "compute_infer": _duration_doc(b.compute_infer),
                "compute_output": _duration_doc(b.compute_output),
            }
            for size, b in sorted(stats.batches.items())
        ],
    }
