"""When an open loop sends: a base rate with periodic spikes, as a seeded schedule.

The rate is piecewise constant: `rate_rps`, except in the windows
[k x spike_every_s, k x spike_every_s + spike_len_s) for k >= 1, where it is
`spike_rate_rps`. Poisson arrivals draw exponential gaps at the rate in force; a draw that
crosses a rate change restarts at the change, which is exact for a Poisson process (it has
no memory). Uniform arrivals step 1 / rate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BurstPlan:
    rate_rps: float
    spike_rate_rps: float = 0.0
    spike_every_s: float = 0.0  # 0: no spikes
    spike_len_s: float = 0.0
    poisson: bool = True

    def __post_init__(self) -> None:
        if self.rate_rps < 0 or self.spike_rate_rps < 0:
            raise ValueError("rates must be >= 0")
        if self.spike_len_s < 0 or self.spike_every_s < 0:
            raise ValueError("spike period and length must be >= 0")
        if self.spikes and self.spike_len_s >= self.spike_every_s:
            raise ValueError("a spike must be shorter than the period between spikes")
        if self.rate_rps == 0 and not (self.spikes and self.spike_rate_rps > 0):
            raise ValueError("nothing would ever be sent: give a rate above 0")

    @property
    def spikes(self) -> bool:
        return self.spike_every_s > 0 and self.spike_len_s > 0


def in_spike(plan: BurstPlan, t: float) -> bool:
    if not plan.spikes or t < plan.spike_every_s:
        return False
    return t % plan.spike_every_s < plan.spike_len_s


def rate_at(plan: BurstPlan, t: float) -> float:
    return plan.spike_rate_rps if in_spike(plan, t) else plan.rate_rps


def next_change(plan: BurstPlan, t: float) -> float:
    """The first time after `t` at which the rate may change (inf without spikes)."""
    if not plan.spikes:
        return math.inf
    period = plan.spike_every_s
    k = math.floor(t / period)
    if k >= 1 and t - k * period < plan.spike_len_s:
        return k * period + plan.spike_len_s
    return (k + 1) * period


def arrival_times(
    plan: BurstPlan, duration_s: float, limit: int, rng: np.random.Generator
) -> Iterator[float]:
    """Send times in [0, duration_s), at most `limit` of them, ascending."""
    t = 0.0
    sent = 0
    while sent < limit:
        rate = rate_at(plan, t)
        change = next_change(plan, t)
        if rate <= 0:
            t = change
            due = False
        else:
            gap = float(rng.exponential(1.0 / rate)) if plan.poisson else 1.0 / rate
            # Poisson arrivals restart at a rate change (no memory); uniform ones send
            # on the change, so the new rate's phase starts there.
            due = t + gap < change or (not plan.poisson and rate_at(plan, change) > 0)
            t = min(t + gap, change)
        if t >= duration_s:
            return
        if due:
            yield t
            sent += 1


def expected_count(plan: BurstPlan, duration_s: float) -> float:
    """The mean number of arrivals in [0, duration_s) (for progress bars and checks)."""
    total = 0.0
    t = 0.0
    while t < duration_s:
        end = min(next_change(plan, t), duration_s)
        total += rate_at(plan, t) * (end - t)
        t = end
    return total
