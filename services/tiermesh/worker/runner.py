"""One onnxruntime session per model and the batch computation. Synchronous: the worker
calls `run` in a thread so the event loop keeps moving data."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from tiermesh.core.jobs import Job
from tiermesh.core.repository import ModelConfig
from tiermesh.core.tensors import TensorData, concat_batch, from_numpy, split_batch, to_numpy


def session_options(intra_op_threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    # Spinning threads make timings on small shared machines vary several-fold.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return opts


class ModelRunner:
    def __init__(self, cfg: ModelConfig, path: Path, intra_op_threads: int = 0) -> None:
        self.cfg = cfg
        self.session = ort.InferenceSession(
            str(path), session_options(intra_op_threads), providers=["CPUExecutionProvider"]
        )
        self._outputs = [o.name for o in cfg.outputs]
        self._types = {o.name: o.datatype for o in cfg.outputs}

    def run(self, jobs: Sequence[Job]) -> list[tuple[TensorData, ...]]:
        """Outputs for each job, in order. Jobs whose non-batch shapes agree are joined
        along the batch dimension into one session run."""
        results: list[tuple[TensorData, ...] | None] = [None] * len(jobs)
        if self.cfg.max_batch_size == 0:
            for i, job in enumerate(jobs):
                results[i] = self._select(job, self._run(job.inputs))
            return [r for r in results if r is not None]
        groups: dict[tuple[tuple[str, tuple[int, ...]], ...], list[int]] = defaultdict(list)
        for i, job in enumerate(jobs):
            groups[tuple(sorted((t.name, t.shape[1:]) for t in job.inputs))].append(i)
        for members in groups.values():
            names = [t.name for t in jobs[members[0]].inputs]
            joined = tuple(
                concat_batch([next(t for t in jobs[i].inputs if t.name == n) for i in members])
                for n in names
            )
            outputs = self._run(joined)
            rows = [jobs[i].rows for i in members]
            pieces = [split_batch(o, rows) for o in outputs]
            for k, i in enumerate(members):
                results[i] = self._select(jobs[i], tuple(p[k] for p in pieces))
        return [r for r in results if r is not None]

    def _run(self, inputs: Sequence[TensorData]) -> tuple[TensorData, ...]:
        feeds = {t.name: to_numpy(t) for t in inputs}
        arrays = self.session.run(self._outputs, feeds)
        return tuple(
            from_numpy(name, arr, self._types[name])
            for name, arr in zip(self._outputs, arrays, strict=True)
        )

    @staticmethod
    def _select(job: Job, outputs: tuple[TensorData, ...]) -> tuple[TensorData, ...]:
        if not job.requested_outputs:
            return outputs
        return tuple(o for o in outputs if o.name in job.requested_outputs)
