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

compute_input covers what happens before the request can wait for a worker: the gateway's
checks, the hop to the router and its input processing (tokenization). execution_count
counts distinct batches (worker, batch start) among this gateway's answers. Each gateway
keeps its own figures in memory, for the calls it answered since it started, as each Triton
server does; with several gateway replicas, each answers for its own calls.

Pure and synchronous; no gRPC.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from tiermesh.core.jobs import Timing

# Batches remembered per model version to count each one once (its requests arrive apart).
RECENT_BATCHES = 4096


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += max(0, ns)


@dataclass
class BatchStats:
    """Per batch size: the batches of that size and their compute time."""

    compute_infer: Duration = field(default_factory=Duration)


@dataclass
class VersionStats:
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    # Rows inferred (a request's batch dimension) and batches run.
    inference_count: int = 0
    execution_count: int = 0
    # Unix ms of the last answer (0: none yet).
    last_inference_ms: int = 0
    batches: dict[int, BatchStats] = field(default_factory=dict)
    _recent: OrderedDict[tuple[str, int], None] = field(default_factory=OrderedDict)

    def new_batch(self, key: tuple[str, int]) -> bool:
        """True the first time a batch is seen (among the last RECENT_BATCHES)."""
        if key in self._recent:
            return False
        self._recent[key] = None
        if len(self._recent) > RECENT_BATCHES:
            self._recent.popitem(last=False)
        return True


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


class InferenceStatistics:
    """The figures of every (model, version) this gateway answered for."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], VersionStats] = {}

    def _of(self, model: str, version: str) -> VersionStats:
        key = (model, version)
        if key not in self._by_key:
            self._by_key[key] = VersionStats()
        return self._by_key[key]

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
        stats.last_inference_ms = responded_ns // 1_000_000
        if stats.new_batch(batch):
            stats.execution_count += 1
            per_size = stats.batches.setdefault(batch_size, BatchStats())
            per_size.compute_infer.add(ns.compute_infer)

    def cache_hit(
        self, model: str, version: str, rows: int, received_ns: int, responded_ns: int
    ) -> None:
        """Called once per answer taken from the response cache."""
        stats = self._of(model, version)
        stats.success.add(responded_ns - received_ns)
        stats.cache_hit.add(responded_ns - received_ns)
        stats.inference_count += rows
        stats.last_inference_ms = responded_ns // 1_000_000

    def failed(self, model: str, version: str, received_ns: int, ended_ns: int) -> None:
        """Called once per call to a known model that ended without an answer."""
        self._of(model, version).fail.add(ended_ns - received_ns)

    def of(self, model: str, version: str) -> VersionStats:
        """The figures of (model, version); zeros when it has none yet."""
        return self._by_key.get((model, version)) or VersionStats()


def _duration_doc(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def model_stats_doc(model: str, version: str, stats: VersionStats) -> dict[str, object]:
    """One entry of Triton's statistics response, in its JSON shape (the REST body; the
    gRPC message is parsed from the same document)."""
    return {
        "name": model,
        "version": version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count,
        "execution_count": stats.execution_count,
        "inference_stats": {
            "success": _duration_doc(stats.success),
            "fail": _duration_doc(stats.fail),
            "queue": _duration_doc(stats.queue),
            "compute_input": _duration_doc(stats.compute_input),
            "compute_infer": _duration_doc(stats.compute_infer),
            "compute_output": _duration_doc(stats.compute_output),
            "cache_hit": _duration_doc(stats.cache_hit),
            "cache_miss": _duration_doc(Duration()),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration_doc(Duration()),
                "compute_infer": _duration_doc(b.compute_infer),
                "compute_output": _duration_doc(Duration()),
            }
            for size, b in sorted(stats.batches.items())
        ],
    }
