"""What each tier's capacity costs: the prices file (deploy/prices.yaml), read by the bench
(cost per 1,000 requests and per million tokens) and by gateways (price gauges that
deploy/prometheus/cost.yml turns into cost metrics). Pure: no network.

    currency: USD
    tiers:
      center: {per_core_hour: 0.048}   # CPU seconds the tier's processes used
      edge: {per_node_hour: 0.012}     # replicas x wall time, whatever they did
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import yaml
from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

CORE_HOUR: Final = "core_hour"
NODE_HOUR: Final = "node_hour"
Unit = Literal["core_hour", "node_hour"]


class _TierPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    per_core_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    per_node_hour: float | None = Field(default=None, ge=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one(self) -> _TierPrice:
        if (self.per_core_hour is None) == (self.per_node_hour is None):
            raise ValueError("give per_core_hour or per_node_hour, one of the two")
        return self


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    currency: str = "USD"
    tiers: dict[str, _TierPrice] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TierPrice:
    unit: Unit
    price: float


@dataclass(frozen=True)
class Prices:
    currency: str
    tiers: dict[str, TierPrice]

    def as_dict(self) -> dict[str, object]:
        return {
            "currency": self.currency,
            "tiers": {t: {"unit": p.unit, "price": p.price} for t, p in self.tiers.items()},
        }


# When no prices file is given (the figures of deploy/prices.yaml).
DEFAULT_PRICES = Prices(
    "USD", {"center": TierPrice(CORE_HOUR, 0.048), "edge": TierPrice(NODE_HOUR, 0.012)}
)


def parse_prices(text: str, source: str = "prices file") -> Prices:
    """ValueError naming the problem when `text` is not a prices file."""
    try:
        parsed = _File.model_validate(yaml.safe_load(text) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{source}: {exc}") from None
    tiers = {
        name: TierPrice(CORE_HOUR, p.per_core_hour)
        if p.per_core_hour is not None
        else TierPrice(NODE_HOUR, float(p.per_node_hour or 0.0))
        for name, p in parsed.tiers.items()
    }
    return Prices(parsed.currency, tiers)


def load_prices(path: Path | None) -> Prices:
    if path is None:
        return DEFAULT_PRICES
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read prices file {path}: {exc}") from None
    return parse_prices(text, str(path))


def export_prices(registry: CollectorRegistry, prices: Prices) -> None:
    """Gauges tiermesh_price_per_core_hour / _per_node_hour by tier (the currency a label)."""
    gauges = {
        CORE_HOUR: Gauge(
            "tiermesh_price_per_core_hour",
            "Price of one core-hour of the tier (prices file)",
            ["tier", "currency"],
            registry=registry,
        ),
        NODE_HOUR: Gauge(
            "tiermesh_price_per_node_hour",
            "Price of one node-hour of the tier (prices file)",
            ["tier", "currency"],
            registry=registry,
        ),
    }
    for tier, p in prices.tiers.items():
        gauges[p.unit].labels(tier=tier, currency=prices.currency).set(p.price)
