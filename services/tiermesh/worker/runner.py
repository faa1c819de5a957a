"""One onnxruntime session per compute unit and the batch computation. Synchronous: the
worker calls `run` in a thread so the event loop keeps moving data."""

from __future__ import annotations

import dataclasses
import enum
import resource
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from prometheus_client import CollectorRegistry, Counter

from tiermesh.core.compute_unit import ComputeUnit
from tiermesh.core.jobs import Job
from tiermesh.core.model_files import VerifiedModel
from tiermesh.core.repository import ModelConfig
from tiermesh.core.sessions import CPU, Opened, ProviderChoice, open_session, session_options
from tiermesh.core.tensors import TensorData, concat_batch, from_numpy, split_batch, to_numpy
from tiermesh.worker.pooling_graph import with_pooling

# A model up to this size (its bytes, external data included) also gets a session with
# every core's thread (`ModelRunner.wide`), for a batch computing alone on an idle worker:
# at concurrency 1 a 16-token MiniLM-L3 request computed in ~3.0 ms on one lane's thread
# against ~1.7 ms on two (benchmarks/RESULTS.md, issue 21). A larger model would hold its
# weights twice; it keeps one session.
WIDE_MAX_BYTES = 256 << 20


def model_bytes(model: VerifiedModel | Path) -> int:
    """The size of a model's weights as a session loads them."""
    if isinstance(model, VerifiedModel):
        return len(model.data) + sum(len(b) for b in model.external.values())
    return model.stat().st_size


def new_session(
    model: VerifiedModel | Path,
    intra_op_threads: int = 0,
    preoptimized: bool = False,
    providers: ProviderChoice | None = None,
    unit: ComputeUnit | None = None,
) -> Opened:
    """A session of `model`: verified bytes (external data included, nothing read from
    disk) or a path the caller vouches for; `preoptimized` skips graph optimisation.
    `providers`: the execution providers asked for (None: CPU); the result says which one
    the session got. `unit`: the compute unit it serves (logged with the provider)."""
    opts = session_options(intra_op_threads)
    if preoptimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    choice = providers or ProviderChoice()
    return open_session(
        model.data if isinstance(model, VerifiedModel) else model,
        opts,
        choice.request,
        fallback=choice.fallback,
        external=model.external if isinstance(model, VerifiedModel) else None,
        unit=unit,
    )


class Counted(enum.Enum):
    """Whose CPU a session call counts."""

    THREAD = "thread"  # the calling thread's (one intra-op thread: it computes alone)
    WINDOW = "window"  # the process's while at least one call runs (shared among them)
    ALONE = "alone"  # the process's during the call (nothing else computes meanwhile)


@dataclass(frozen=True, slots=True)
class Entered:
    """A session call's start, as `ComputeTime.leave` needs it."""

    wall_s: float
    cpu_s: float  # the thread's CPU (THREAD) or the process's (ALONE) at the start
    counted: Counted


class ComputeTime:
    """Seconds spent inside `InferenceSession.run`, summed over every runner of a worker:
    wall time, and onnxruntime's CPU time. Benchmarks subtract the CPU figure from the
    worker's total to get the cost of everything around the model.

    With one intra-op thread per call (`per_thread`: the compute lanes' default) a call
    computes on the thread that makes it, so its CPU is that thread's CPU time during the
    call: exact, however many calls overlap. With more, onnxruntime's pool threads compute
    too, and the figure is the process's CPU (user + system, every thread) while at least
    one call was running: an upper bound, which counts what other threads (the event loop)
    did meanwhile."""

    def __init__(self, registry: CollectorRegistry | None = None, per_thread: bool = False) -> None:
        self._per_thread = per_thread
        self._lock = threading.Lock()
        self._running = 0
        self._cpu_at_start = 0.0
        self.wall = Counter(
            "tiermesh_onnxruntime_seconds",
            "Wall time inside onnxruntime session calls",
            registry=registry,
        )
        self.cpu = Counter(
            "tiermesh_onnxruntime_cpu_seconds",
            "CPU time of onnxruntime session calls (with one intra-op thread, the calling "
            "thread's; otherwise the process's while a call was running)",
            registry=registry,
        )

    @staticmethod
    def _process_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def enter(self, alone: bool = False) -> Entered:
        """Called right before a session call, in its thread; returns what to hand to
        `leave`. Overlapping calls count the process's CPU of the interval once. `alone`: a
        call with more threads than one while nothing else computes (a wide session's):
        the process's CPU during it, however the worker counts otherwise."""
        if alone:
            return Entered(time.perf_counter(), self._process_cpu(), Counted.ALONE)
        if self._per_thread:
            return Entered(time.perf_counter(), time.thread_time(), Counted.THREAD)
        with self._lock:
            if self._running == 0:
                self._cpu_at_start = self._process_cpu()
            self._running += 1
        return Entered(time.perf_counter(), 0.0, Counted.WINDOW)

    def leave(self, started: Entered) -> None:
        self.wall.inc(time.perf_counter() - started.wall_s)
        if started.counted is Counted.ALONE:
            self.cpu.inc(max(0.0, self._process_cpu() - started.cpu_s))
            return
        if started.counted is Counted.THREAD:
            self.cpu.inc(max(0.0, time.thread_time() - started.cpu_s))
            return
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self.cpu.inc(max(0.0, self._process_cpu() - self._cpu_at_start))


@dataclass(frozen=True, slots=True)
class JobOutputs:
    outputs: tuple[TensorData, ...]
    # The job's inputs as the batch ran them (padded), for postprocess steps that need them.
    padded_inputs: tuple[TensorData, ...]


def pad_to(tensor: TensorData, shape: tuple[int, ...], value: int) -> TensorData:
    """Pad every non-batch dimension at its end up to `shape` (batch dimension kept)."""
    if tensor.shape[1:] == shape:
        return tensor
    arr = to_numpy(tensor)
    widths = [(0, 0)] + [(0, want - have) for have, want in zip(arr.shape[1:], shape, strict=True)]
    return from_numpy(tensor.name, np.pad(arr, widths, constant_values=value), tensor.datatype)


def _pooled(cfg: ModelConfig, model: VerifiedModel | Path) -> VerifiedModel | None:
    """The model with its config's pooling step in the graph (worker/pooling_graph.py), or
    None: no pool step, or a graph it does not fit (postprocess pools those results)."""
    if cfg.pool is None or cfg.generation is not None:
        return None
    if isinstance(model, VerifiedModel):
        fused = with_pooling(model.data, cfg.pool)
        return None if fused is None else dataclasses.replace(model, data=fused)
    fused = with_pooling(model.read_bytes(), cfg.pool, external_ok=False)
    return None if fused is None else VerifiedModel(model, fused)


class ModelRunner:
    def __init__(
        self,
        cfg: ModelConfig,
        model: VerifiedModel | Path,
        intra_op_threads: int = 0,
        preoptimized: bool = False,
        compute_time: ComputeTime | None = None,
        wide_threads: int = 0,
        providers: ProviderChoice | None = None,
        unit: ComputeUnit | None = None,
    ) -> None:
        """`model`: what `ModelRepository.verified_model` returned (the worker's way: the
        session is built from the bytes that matched their sha256, external data included,
        and reads nothing from disk), or a path for files the caller vouches for (tests,
        tools). `preoptimized`: the file was saved after graph optimisation (tiermesh
        optimize's `graph` variant), so loading skips it instead of redoing it at every start.
        `wide_threads` above `intra_op_threads`: a second session of that many threads
        (`wide`) for a batch computing alone, when the model is at most WIDE_MAX_BYTES.
        `providers`: the execution providers asked for (None: CPU; core/sessions.py);
        `provider` is the one the session got. `unit`: the compute unit, for the log."""
        self.cfg = cfg
        self._compute_time = compute_time
        started = time.perf_counter()
        self._outputs = [o.name for o in cfg.runs_outputs]
        self._types = {o.name: o.datatype for o in cfg.runs_outputs}
        pooled = _pooled(cfg, model)
        if pooled is not None and cfg.pool is not None:
            # onnxruntime pools in the batch's call: its results carry the embedding.
            model, spec = pooled, cfg.pool
            self._outputs = [spec.output if n == spec.source else n for n in self._outputs]
            self._types[spec.output] = "FP32"
        self.session, self.provider = new_session(
            model, intra_op_threads, preoptimized, providers, unit
        )
        self.wide: ort.InferenceSession | None = None
        # More CPU threads help a CPU session only; another provider's would hold its
        # weights twice on the device for nothing.
        if (
            self.provider == CPU
            and wide_threads > intra_op_threads > 0
            and model_bytes(model) <= WIDE_MAX_BYTES
        ):
            self.wide = new_session(model, wide_threads, preoptimized, providers).session
        self.load_s = time.perf_counter() - started

    def run(self, jobs: Sequence[Job], alone: bool = False) -> list[JobOutputs]:
        """Outputs for each job, in order. Inputs the config pads are padded to the longest
        in the batch; jobs whose remaining shapes agree run as one session call. `alone`:
        nothing else computes meanwhile, so the wide session (if any) may take every core."""
        wide = self.wide if alone else None
        if self.cfg.max_batch_size == 0:
            return [JobOutputs(self._run(job.inputs, wide), job.inputs) for job in jobs]
        padded = [self._pad(job, jobs) for job in jobs]
        results: list[JobOutputs | None] = [None] * len(jobs)
        groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = defaultdict(list)
        for i, inputs in enumerate(padded):
            groups[tuple(sorted((t.name, t.shape[1:]) for t in inputs))].append(i)
        for members in groups.values():
            names = [t.name for t in padded[members[0]]]
            joined = tuple(
                concat_batch([next(t for t in padded[i] if t.name == n) for i in members])
                for n in names
            )
            outputs = self._run(joined, wide)
            pieces = [split_batch(o, [jobs[i].rows for i in members]) for o in outputs]
            for k, i in enumerate(members):
                results[i] = JobOutputs(tuple(p[k] for p in pieces), padded[i])
        return [r for r in results if r is not None]

    def _pad(self, job: Job, batch: Sequence[Job]) -> tuple[TensorData, ...]:
        out = []
        for t in job.inputs:
            if t.name not in self.cfg.pad:
                out.append(t)
                continue
            same = [u.shape[1:] for j in batch for u in j.inputs if u.name == t.name]
            longest = tuple(max(dims) for dims in zip(*same, strict=True))
            out.append(pad_to(t, longest, self.cfg.pad[t.name]))
        return tuple(out)

    def _run(
        self, inputs: Sequence[TensorData], wide: ort.InferenceSession | None = None
    ) -> tuple[TensorData, ...]:
        feeds = {t.name: to_numpy(t) for t in inputs}
        clock = self._compute_time
        started = clock.enter(alone=wide is not None) if clock is not None else None
        try:
            arrays = (wide or self.session).run(self._outputs, feeds)
        finally:
            if clock is not None and started is not None:
                clock.leave(started)
        return tuple(
            from_numpy(name, arr, self._types[name])
            for name, arr in zip(self._outputs, arrays, strict=True)
        )
