"""Output drift: cosine similarity between what the stable and the canary version answered
to the same (mirrored) request, and the pairing of the two answers as they arrive.

Pure and synchronous; the gateway's loop owns a ShadowPairs and passes it the clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tiermesh.core.tensors import TensorData, to_numpy

# Outputs of these datatypes are compared; labels (BYTES) and the like are not.
NUMERIC = frozenset(
    {"FP16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32"}
)


def cosine(a: Sequence[TensorData], b: Sequence[TensorData]) -> float | None:
    """Cosine similarity of the numeric outputs both answers have (by name), flattened
    together; None when there is nothing to compare or the shapes differ. Two all-zero
    answers are identical (1.0); one all-zero answer against another is 0.0."""
    theirs = {t.name: t for t in b}
    xs, ys = [], []
    for t in a:
        other = theirs.get(t.name)
        if other is None or t.datatype not in NUMERIC or other.datatype != t.datatype:
            continue
        if t.shape != other.shape:
            return None
        xs.append(to_numpy(t).astype(np.float64).ravel())
        ys.append(to_numpy(other).astype(np.float64).ravel())
    if not xs:
        return None
    x, y = np.concatenate(xs), np.concatenate(ys)
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return float(np.dot(x, y) / (nx * ny))


@dataclass(frozen=True, slots=True)
class Pair:
    model: str
    canary_version: str
    similarity: float


@dataclass(slots=True)
class _Waiting:
    model: str
    expires_ns: int
    outputs: tuple[TensorData, ...] | None = None  # whichever answer came first
    canary_version: str = ""  # known once the shadow's answer is in


class ShadowPairs:
    """Primary and shadow answers of mirrored requests, keyed by the shadow's request id,
    until both are in. Bounded: the oldest waiting pair is dropped first, and pairs
    expire at the request's deadline (a shadow that never answers leaves nothing behind)."""

    def __init__(self, max_waiting: int = 10_000) -> None:
        self._waiting: OrderedDict[str, _Waiting] = OrderedDict()
        self._max = max_waiting

    def expect(self, shadow_id: str, model: str, deadline_ns: int, now_ns: int) -> None:
        """Called once the router said it mirrored the request."""
        self._expire(now_ns)
        self._waiting[shadow_id] = _Waiting(model, deadline_ns)
        while len(self._waiting) > self._max:
            self._waiting.popitem(last=False)

    def primary(self, shadow_id: str, outputs: tuple[TensorData, ...]) -> Pair | None:
        """The stable answer of a mirrored request; a Pair once the shadow's is in too."""
        return self._arrive(shadow_id, outputs, "")

    def shadow(
        self, shadow_id: str, canary_version: str, outputs: tuple[TensorData, ...]
    ) -> Pair | None:
        """The canary's answer to the copy; a Pair once the primary's is in too."""
        return self._arrive(shadow_id, outputs, canary_version)

    def forget(self, shadow_id: str) -> None:
        """One side failed: nothing to compare."""
        self._waiting.pop(shadow_id, None)

    def _arrive(
        self, shadow_id: str, outputs: tuple[TensorData, ...], canary_version: str
    ) -> Pair | None:
        waiting = self._waiting.get(shadow_id)
        if waiting is None:
            return None
        first_was_shadow = bool(waiting.canary_version)
        if waiting.outputs is None or first_was_shadow == bool(canary_version):
            waiting.outputs, waiting.canary_version = outputs, canary_version
            return None
        del self._waiting[shadow_id]
        if canary_version:
            stable, canary = waiting.outputs, outputs
        else:
            stable, canary, canary_version = outputs, waiting.outputs, waiting.canary_version
        value = cosine(stable, canary)
        return None if value is None else Pair(waiting.model, canary_version, value)

    def _expire(self, now_ns: int) -> None:
        # Insertion order is nearly deadline order; stop at the first live one.
        while self._waiting:
            key, first = next(iter(self._waiting.items()))
            if first.expires_ns > now_ns:
                return
            del self._waiting[key]

    def __len__(self) -> int:
        return len(self._waiting)
