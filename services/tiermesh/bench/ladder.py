"""The concurrency ladder's decisions: when to stop climbing, and where the knee is.

A step is one closed-loop run at a fixed concurrency. Climbing stops when a step's p99
passes the SLO, its error rate passes the limit, or throughput gained less than
`min_gain` over the best step before it `patience` times in a row. The knee is the
lowest concurrency that reaches within `min_gain` of the best throughput among the steps
that kept the SLO: more callers past it buy latency, not throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tiermesh.bench.records import Record
from tiermesh.bench.stats import figures

DEFAULT_STEPS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class LadderPlan:
    concurrencies: tuple[int, ...] = DEFAULT_STEPS
    step_requests: int = 400
    step_duration_s: float = 10.0
    slo_ms: float | None = None  # p99 bound; None: throughput alone decides
    min_gain: float = 0.05
    patience: int = 2
    max_error_rate: float = 0.01

    def __post_init__(self) -> None:
        if not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise ValueError("ladder steps must be concurrencies >= 1")
        if list(self.concurrencies) != sorted(set(self.concurrencies)):
            raise ValueError("ladder steps must rise strictly")
        if self.step_requests < 1 or self.step_duration_s <= 0:
            raise ValueError("a step needs requests >= 1 and a duration > 0")
        if self.patience < 1:
            raise ValueError("patience must be >= 1")


@dataclass(frozen=True)
class Step:
    index: int
    concurrency: int
    sent: int
    ok: int
    wall_s: float
    throughput_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    error_rate: float
    cpu_s: float = math.nan
    cores_used: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Knee:
    index: int
    concurrency: int
    throughput_rps: float
    p99_ms: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_step(
    index: int,
    concurrency: int,
    records: Sequence[Record],
    wall_s: float,
    cpu_s: float = math.nan,
) -> Step:
    f = figures(records, wall_s)
    return Step(
        index=index,
        concurrency=concurrency,
        sent=f.sent,
        ok=f.ok,
        wall_s=wall_s,
        throughput_rps=f.throughput_rps,
        p50_ms=f.p50_ms,
        p95_ms=f.p95_ms,
        p99_ms=f.p99_ms,
        error_rate=f.error_rate,
        cpu_s=cpu_s,
        cores_used=cpu_s / wall_s if wall_s > 0 else math.nan,
    )


def within_slo(step: Step, plan: LadderPlan) -> bool:
    if step.ok == 0 or step.error_rate > plan.max_error_rate:
        return False
    return plan.slo_ms is None or step.p99_ms <= plan.slo_ms


def stop_reason(steps: Sequence[Step], plan: LadderPlan) -> str | None:
    """Why climbing stops after the last of `steps`, or None to take the next step."""
    if not steps:
        return None
    last = steps[-1]
    if last.ok == 0:
        return f"no answers at concurrency {last.concurrency}"
    if plan.slo_ms is not None and last.p99_ms > plan.slo_ms:
        return f"p99 {last.p99_ms:.1f} ms passed the SLO of {plan.slo_ms:g} ms"
    if last.error_rate > plan.max_error_rate:
        return f"error rate {last.error_rate:.1%} passed {plan.max_error_rate:.1%}"
    flat = 0
    for i in range(len(steps) - 1, 0, -1):
        best_before = max(s.throughput_rps for s in steps[:i])
        if steps[i].throughput_rps >= best_before * (1 + plan.min_gain):
            break
        flat += 1
    if flat >= plan.patience:
        return (
            f"throughput gained under {plan.min_gain:.0%} {flat} steps in a row "
            f"(best {max(s.throughput_rps for s in steps):.1f}/s)"
        )
    return None


def knee(steps: Sequence[Step], plan: LadderPlan) -> Knee | None:
    """The lowest concurrency within `min_gain` of the best SLO-keeping throughput; None
    when no step kept the SLO."""
    good = [s for s in steps if within_slo(s, plan)]
    if not good:
        return None
    best = max(s.throughput_rps for s in good)
    pick = min(
        (s for s in good if s.throughput_rps >= best * (1 - plan.min_gain)),
        key=lambda s: s.concurrency,
    )
    slo = f", p99 within {plan.slo_ms:g} ms" if plan.slo_ms is not None else ""
    return Knee(
        index=pick.index,
        concurrency=pick.concurrency,
        throughput_rps=pick.throughput_rps,
        p99_ms=pick.p99_ms,
        reason=(
            f"lowest concurrency within {plan.min_gain:.0%} of the best throughput "
            f"({best:.1f}/s){slo}"
        ),
    )
