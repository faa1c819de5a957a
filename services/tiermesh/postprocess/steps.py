"""Per-model output steps (pooling, softmax + top-k, ...). Pure: results in, results out."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import grpc

from tiermesh.core.jobs import JobResult

Step = Callable[[JobResult], JobResult]


def identity(result: JobResult) -> JobResult:
    return result


class Steps:
    """The output step of each model; models without one pass through unchanged."""

    def __init__(self, steps: Mapping[str, Step] | None = None) -> None:
        self._steps = dict(steps or {})

    def apply(self, result: JobResult) -> JobResult:
        """Failed results pass through untouched; the caller only gets their status."""
        if result.code != grpc.StatusCode.OK:
            return result
        return self._steps.get(result.model, identity)(result)
