"""What a bench run cost: the mesh's CPU time and replicas per tier, priced per tier.

The mesh's processes are read through their Prometheus endpoints (`process_cpu_seconds_total`
of prometheus_client's process collector, which every tiermesh service exports) before and
after the measured run. Each endpoint is assigned to a tier by the caller
(`--mesh-metrics center=URL,URL --mesh-metrics edge=URL`); the number of endpoints of a tier
is its replica count. A tier priced per core-hour costs its CPU seconds; one priced per
node-hour costs replicas x wall time. The arithmetic is pure (`cost`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiermesh.bench import genstats
from tiermesh.bench.metrics import fetch, parse_gauge
from tiermesh.bench.records import Record
from tiermesh.core.prices import CORE_HOUR, Prices, load_prices

CPU_METRIC = "process_cpu_seconds_total"


def parse_targets(items: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """["center=URL,URL", "edge=URL"] -> {"center": (URL, URL), "edge": (URL,)}."""
    out: dict[str, list[str]] = {}
    for item in items:
        tier, sep, urls = item.partition("=")
        found = [u.strip() for u in urls.split(",") if u.strip()]
        if not sep or not tier.strip() or not found:
            raise ValueError(f"expected TIER=URL[,URL...], got {item!r}")
        out.setdefault(tier.strip(), []).extend(found)
    return {t: tuple(u) for t, u in out.items()}


@dataclass(frozen=True)
class TierUsage:
    """What one tier's processes used over the run."""

    tier: str
    replicas: int
    cpu_s: float
    wall_s: float


def read_cpu(
    targets: Mapping[str, Sequence[str]], fetcher: Callable[[str], str] = fetch
) -> dict[str, float]:
    """CPU seconds of each endpoint so far (nan where it could not be read)."""
    out: dict[str, float] = {}
    for urls in targets.values():
        for url in urls:
            try:
                value = parse_gauge(fetcher(url), CPU_METRIC)
            except (OSError, ValueError):
                value = None
            out[url] = math.nan if value is None else value
    return out


def usage(
    targets: Mapping[str, Sequence[str]],
    before: Mapping[str, float],
    after: Mapping[str, float],
    wall_s: float,
) -> list[TierUsage]:
    """Per tier: CPU seconds between the two readings (nan when an endpoint was unreadable
    or restarted) and its replica count."""
    out = []
    for tier, urls in targets.items():
        spent = [after.get(u, math.nan) - before.get(u, math.nan) for u in urls]
        cpu = math.fsum(spent) if all(s >= 0 for s in spent) else math.nan
        out.append(TierUsage(tier, len(urls), cpu, wall_s))
    return out


def cost(
    usages: Sequence[TierUsage], prices: Prices, requests_ok: int, tokens: int
) -> dict[str, Any]:
    """The run's cost per tier and in all, per 1,000 answered requests and per million
    tokens (nan where there is no denominator or a tier could not be measured). Tiers
    without a price cost nothing and are listed as such."""
    rows = []
    total = 0.0
    for u in usages:
        price = prices.tiers.get(u.tier)
        if price is None:
            amount = 0.0
        elif price.unit == CORE_HOUR:
            amount = u.cpu_s / 3600 * price.price
        else:
            amount = u.replicas * u.wall_s / 3600 * price.price
        total += amount
        rows.append(
            {
                "tier": u.tier,
                "replicas": u.replicas,
                "cpu_s": u.cpu_s,
                "cores_used": u.cpu_s / u.wall_s if u.wall_s > 0 else math.nan,
                "unit": price.unit if price else None,
                "price": price.price if price else None,
                "cost": amount,
            }
        )
    return {
        "currency": prices.currency,
        "tiers": rows,
        "total": total,
        "requests_ok": requests_ok,
        "tokens": tokens,
        "per_1k_requests": total / requests_ok * 1000 if requests_ok else math.nan,
        "per_million_tokens": total / tokens * 1e6 if tokens else math.nan,
    }


def not_measured(prices: Prices, why: str) -> dict[str, Any]:
    """The cost section of a run whose mesh was not measured."""
    return {
        "currency": prices.currency,
        "tiers": [],
        "total": None,
        "per_1k_requests": None,
        "per_million_tokens": None,
        "note": why,
    }


def tokens_of(records: Sequence[Record]) -> int:
    """Tokens of the answered requests, as their replies count them (text models); a
    generation request's prompt and generated tokens."""
    return sum(
        r.outcome.reply.tokens or 0 for r in records if r.ok and r.outcome.reply is not None
    ) + genstats.tokens_of(records)


def run_cost(
    mesh_metrics: Mapping[str, Sequence[str]],
    prices_file: Path | None,
    records: Sequence[Record],
    before: Mapping[str, float],
    after: Mapping[str, float],
    wall_s: float,
) -> dict[str, Any]:
    """The cost section of a measured run (ValueError: a bad prices file)."""
    prices = load_prices(prices_file)
    if not mesh_metrics:
        return not_measured(
            prices, "no --mesh-metrics: the mesh's CPU time was not measured, no cost"
        )
    usages = usage(mesh_metrics, before, after, wall_s)
    doc = cost(usages, prices, sum(1 for r in records if r.ok), tokens_of(records))
    doc["prices"] = prices.as_dict()
    return doc
