"""Which tier serves a request: a pure decision from its cost, its deadline and what the
tiers look like right now (liveness from worker heartbeats, backlog, measured drain rate).

Policy:
- Preferred tier: the lightest tier (edge before center) whose `max_cost` admits the
  request's cost (0 = no limit); the last tier takes everything else.
- A tier with no live worker is never chosen.
- Spill-over: when the preferred tier's backlog would make the request miss its deadline
  (backlog / rate > time left), another live tier that would not is chosen: light work
  spills from edge to center, and light work goes to edge when center is saturated. Heavy
  work (over the edge's max_cost) only goes to edge when center has no live worker.
- When no live tier would meet the deadline, the preferred live tier takes it anyway
  (admission then refuses it fast if it really cannot drain in time).
- No live tier at all: None (the caller answers UNAVAILABLE).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tiermesh.core.tier_spec import TierSpec


@dataclass(frozen=True, slots=True)
class TierState:
    alive: bool
    backlog: int = 0  # entries waiting in the stream the request would join
    rate: float = 0.0  # entries per second that stream drains at; 0 = not measured yet

    def drain_ms(self) -> float:
        if self.backlog <= 0 or self.rate <= 0:
            return 0.0
        return self.backlog / self.rate * 1000


def preferred(tiers: Sequence[TierSpec], cost: int) -> TierSpec:
    """The lightest tier whose max_cost admits `cost`; the last one takes the rest."""
    for tier in tiers[:-1]:
        if tier.max_cost == 0 or cost <= tier.max_cost:
            return tier
    return tiers[-1]


def choose_tier(
    tiers: Sequence[TierSpec],
    cost: int,
    ms_left: float | None,
    states: Mapping[str, TierState],
) -> TierSpec | None:
    """The tier to send a request of `cost` to, or None when no tier has a live worker."""
    if not tiers:
        return None
    first = preferred(tiers, cost)
    light = first is not tiers[-1]
    live = [t for t in tiers if states.get(t.name, TierState(False)).alive]
    if not live:
        return None
    # Heavy work stays off lighter tiers unless nothing else is alive.
    eligible = live if light else [t for t in live if t is tiers[-1]] or live
    ordered = sorted(eligible, key=lambda t: t is not first)  # preferred first, stable

    def meets_deadline(t: TierSpec) -> bool:
        return ms_left is None or states[t.name].drain_ms() <= ms_left

    for tier in ordered:
        if meets_deadline(tier):
            return tier
    return ordered[0]
