"""The accuracy gate: `cosine>=0.99` (mean), `cosine_p1>=0.98`, `cosine_min>=0.95`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from tiermesh.optimize.evaluate import Accuracy

_GATE = re.compile(r"^\s*(cosine|cosine_p1|cosine_min)\s*>=\s*([0-9]*\.?[0-9]+)\s*$")


@dataclass(frozen=True)
class AccuracyGate:
    metric: str
    threshold: float

    def value(self, acc: Accuracy) -> float:
        return {"cosine": acc.mean, "cosine_p1": acc.p1, "cosine_min": acc.min}[self.metric]

    def passes(self, acc: Accuracy) -> bool:
        return self.value(acc) >= self.threshold

    def __str__(self) -> str:
        return f"{self.metric}>={self.threshold:g}"


def parse_gate(text: str) -> AccuracyGate:
    """Raise ValueError naming the accepted forms on anything else."""
    found = _GATE.match(text)
    if not found:
        raise ValueError(
            f"gate {text!r} not understood: use cosine>=X (mean), cosine_p1>=X or cosine_min>=X"
        )
    threshold = float(found.group(2))
    if not 0 < threshold <= 1:
        raise ValueError(f"gate threshold {threshold} must be in (0, 1]")
    return AccuracyGate(found.group(1), threshold)
