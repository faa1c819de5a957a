"""Per-model output steps (pooling, softmax + top-k, ...). Pure: results in, results out.

Applied by postprocess to online answers and by the worker to batch-job results
(worker/background.py), so both give the same answer for the same input."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc
import numpy as np

from tiermesh.core.jobs import JobResult
from tiermesh.core.model_config import ModelConfig, PoolSpec
from tiermesh.core.tensors import from_numpy, to_numpy

Step = Callable[[JobResult], JobResult]


def identity(result: JobResult) -> JobResult:
    return result


def mean_pool_l2(spec: PoolSpec) -> Step:
    """Sentence embeddings: the mean of the token vectors the mask keeps, L2-normalised.
    The mask travels as aux (padded like the batch ran it), the token vectors as output. A
    worker's session that pooled in its graph (worker/pooling_graph.py) hands on the
    embedding itself: that result passes unchanged."""

    def step(result: JobResult) -> JobResult:
        source = next((o for o in result.outputs if o.name == spec.source), None)
        if source is None:
            return result
        tokens = to_numpy(source)
        mask = to_numpy(next(t for t in result.aux if t.name == spec.mask))
        weights = mask.astype(np.float32)[:, :, None]
        summed = (tokens.astype(np.float32) * weights).sum(axis=1)
        # np.maximum and the norm spelt out compute what np.clip and np.linalg.norm do,
        # bit for bit, without their Python-level overhead (~12 us a result).
        counts = np.maximum(weights.sum(axis=1), 1e-9)
        pooled = summed / counts
        norms = np.maximum(np.sqrt(np.add.reduce(pooled * pooled, axis=1, keepdims=True)), 1e-12)
        out = from_numpy(spec.output, (pooled / norms).astype(np.float32), "FP32")
        return result.with_(outputs=(out,), aux=())

    return step


class OutputSteps:
    """The output step of each model; models without one pass through unchanged."""

    def __init__(
        self, steps: Mapping[str, Step] | None = None, models: frozenset[str] = frozenset()
    ) -> None:
        self._steps = dict(steps or {})
        # Every model of the repository these steps were built from (with a step or not).
        self.models = models | frozenset(self._steps)

    @classmethod
    def for_models(cls, configs: Mapping[str, ModelConfig]) -> OutputSteps:
        """Built at postprocess start from the model repository (and again when a result
        names a model the repository did not hold then: one loaded after the start)."""
        steps = {name: mean_pool_l2(c.pool) for name, c in configs.items() if c.pool}
        return cls(steps, frozenset(configs))

    def apply(self, result: JobResult) -> JobResult:
        """Failed results pass through untouched; the caller only gets their status."""
        if result.code != grpc.StatusCode.OK:
            return result
        return self._steps.get(result.model, identity)(result)
