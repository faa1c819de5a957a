"""The `canary:` section of a model's config.yaml: when a canary version is judged, and how
much of the stable traffic is mirrored to it to measure output drift."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class CanarySpec:
    # Outcomes of the last window_s seconds (since the rollout started) are judged.
    window_s: float = 30.0
    # Below this many canary answers in the window the error rate and p99 are not judged.
    min_requests: int = 20
    # Share of canary answers that may fail (any code but OK and CANCELLED).
    max_error_rate: float = 0.05
    # The canary's p99 may be this many times the stable one's; the stable p99 counts as at
    # least p99_floor_ms, so that noise on a sub-millisecond model cannot roll back.
    max_p99_ratio: float = 2.0
    p99_floor_ms: float = 10.0
    # Mean cosine similarity of canary outputs to stable ones on mirrored requests, judged
    # once min_pairs pairs were seen in the window.
    min_cosine: float = 0.99
    min_pairs: int = 5
    # Share of stable-routed requests that are also run on the canary (answer discarded).
    mirror_fraction: float = 0.1

    def as_strings(self) -> dict[str, str]:
        """The thresholds as flat strings (stored beside a rollout, logged with a change)."""
        return {f.name: repr(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_strings(cls, raw: dict[str, str]) -> CanarySpec:
        """Inverse of as_strings; fields missing from `raw` keep their defaults."""
        return parse_canary({k: v for k, v in raw.items() if k in _FIELDS})


_FIELDS = {f.name: f.type for f in fields(CanarySpec)}


def parse_canary(raw: dict[str, Any] | None) -> CanarySpec:
    """The section as parsed YAML (or strings); raises ValueError on a bad value."""
    raw = dict(raw or {})
    unknown = set(raw) - set(_FIELDS)
    if unknown:
        raise ValueError(f"canary: unknown setting(s) {sorted(unknown)}")
    values: dict[str, Any] = {}
    for name, kind in _FIELDS.items():
        if name in raw:
            values[name] = int(raw[name]) if kind == "int" else float(raw[name])
    spec = CanarySpec(**values)
    if spec.window_s <= 0 or spec.min_requests < 1 or spec.min_pairs < 1:
        raise ValueError("canary: window_s must be > 0, min_requests and min_pairs >= 1")
    if not 0 <= spec.max_error_rate <= 1 or not 0 <= spec.mirror_fraction <= 1:
        raise ValueError("canary: max_error_rate and mirror_fraction must be in 0..1")
    if spec.max_p99_ratio <= 0 or spec.p99_floor_ms < 0 or not -1 <= spec.min_cosine <= 1:
        raise ValueError("canary: max_p99_ratio > 0, p99_floor_ms >= 0, min_cosine in -1..1")
    return spec
