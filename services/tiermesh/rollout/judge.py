"""The verdict on a canary: pure, from its window stats, the stable version's and the
thresholds. No Redis, no gRPC, no clock.

Checks, first breach wins: error rate (once the canary has min_requests answers), output
drift (mean cosine to stable on mirrored requests, once min_pairs pairs), p99 latency
against stable (once both have min_requests OK answers). When no check had enough data
the verdict is insufficient_data; otherwise hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tiermesh.core.canary_spec import CanarySpec
from tiermesh.rollout.window import WindowStats

Action = Literal["hold", "rollback", "insufficient_data"]
Reason = Literal["", "error_rate", "drift", "latency"]


@dataclass(frozen=True, slots=True)
class RolloutVerdict:
    action: Action
    reason: Reason = ""
    detail: str = ""


def judge(stable: WindowStats, canary: WindowStats, spec: CanarySpec) -> RolloutVerdict:
    judged = False
    if canary.answers >= spec.min_requests:
        judged = True
        if canary.error_rate > spec.max_error_rate:
            return RolloutVerdict(
                "rollback",
                "error_rate",
                f"{canary.errors}/{canary.answers} canary answers failed "
                f"({canary.error_rate:.1%} > {spec.max_error_rate:.1%})",
            )
    mean = canary.cosine_mean
    if mean is not None and canary.cosine_n >= spec.min_pairs:
        judged = True
        if mean < spec.min_cosine:
            return RolloutVerdict(
                "rollback",
                "drift",
                f"mean cosine to stable {mean:.4f} < {spec.min_cosine} "
                f"over {canary.cosine_n} mirrored requests",
            )
    c99, s99 = canary.p99_ms(), stable.p99_ms()
    if (
        c99 is not None
        and s99 is not None
        and canary.ok >= spec.min_requests
        and stable.ok >= spec.min_requests
    ):
        judged = True
        limit = spec.max_p99_ratio * max(s99, spec.p99_floor_ms)
        if c99 > limit:
            return RolloutVerdict(
                "rollback",
                "latency",
                f"canary p99 {c99:.1f} ms > {limit:.1f} ms "
                f"({spec.max_p99_ratio}x stable p99 {s99:.1f} ms, floor {spec.p99_floor_ms} ms)",
            )
    return RolloutVerdict("hold") if judged else RolloutVerdict("insufficient_data")
