"""The `tiers:` section of a model's config.yaml: where a model is served (edge, center),
up to what request cost each tier is preferred, and which variant each serves.

One model name, one answer: by default every tier serves the same variant, so which tier
answers a request (its cost, the load, spill-over, failover) never changes the output. Tiers
serving different variants (a cheaper INT8 edge, say) are refused unless the config opts in:

    tiers:
      mixed_variants: true        # callers accept answers that depend on the tier
      edge: {variant: int8, max_cost: 64}
      center: {variant: fp32}

A caller that names a variant (the `variant` request parameter) gets that one on any tier;
every answer says which variant gave it (the `tiermesh.variant` response parameter).

A tier may name the onnxruntime execution providers its workers ask for, in order (names
or short aliases, with provider options; core/sessions.py); a worker's own
TIERMESH_EXECUTION_PROVIDERS wins over it, and without either a worker runs on CPU:

    tiers:
      edge: {variant: fp32, max_cost: 64}
      center:
        execution_providers: [cuda, {name: tensorrt, options: {trt_fp16_enable: "1"}}]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiermesh.core.sessions import ProviderError, ProviderRequest, parse_providers

TIER_NAMES = ("edge", "center")
# The key under `tiers:` that lets tiers serve different variants (not a tier name).
MIXED_VARIANTS = "mixed_variants"


class TierConfigError(ValueError):
    """A `tiers:` section that cannot be served (model_config turns it into RepositoryError)."""


@dataclass(frozen=True, slots=True)
class TierSpec:
    """How one tier serves a model: which variant ("" = the model's default one), and up to
    what request cost (rows x length: tokens for text) it is the preferred tier. 0 = no
    limit."""

    name: str
    variant: str
    max_cost: int = 0
    # The onnxruntime execution providers this tier's workers ask for, in order (empty:
    # CPU, unless a worker's own setting names some).
    execution_providers: ProviderRequest = ()


def parse_tiers(raw: Mapping[str, Any]) -> tuple[tuple[TierSpec, ...], bool]:
    """The tiers of a `tiers:` mapping, lightest first as written, and its `mixed_variants`
    flag (false when absent)."""
    mixed = raw.get(MIXED_VARIANTS, False)
    if not isinstance(mixed, bool):
        raise TierConfigError(f"tiers.{MIXED_VARIANTS}: expected true or false, got {mixed!r}")
    tiers = tuple(
        TierSpec(
            name=str(name),
            variant=str((spec or {}).get("variant", "")),
            max_cost=int((spec or {}).get("max_cost", 0)),
            execution_providers=_providers(str(name), (spec or {}).get("execution_providers")),
        )
        for name, spec in raw.items()
        if name != MIXED_VARIANTS
    )
    return tiers, mixed


def _providers(tier: str, raw: object) -> ProviderRequest:
    """A tier's `execution_providers`: a list of names or `{name, options}` mappings."""
    if raw is None:
        return ()
    where = f"tiers.{tier}.execution_providers"
    if not isinstance(raw, list):
        raise TierConfigError(
            f"{where}: expected a list of provider names or {{name, options}}, got {raw!r}"
        )
    try:
        return parse_providers(raw)
    except ProviderError as exc:
        raise TierConfigError(f"{where}: {exc}") from None


def served_variants(tiers: Sequence[TierSpec], default_variant: str) -> dict[str, str]:
    """The variant each tier serves to a caller that names none (tier name -> variant)."""
    return {t.name: t.variant or default_variant for t in tiers}


def check_tiers(
    tiers: Sequence[TierSpec], variants: Mapping[str, str], default_variant: str, mixed: bool
) -> None:
    """Raise TierConfigError for an unknown tier or variant, a negative max_cost, or tiers
    serving different variants without `mixed_variants: true`."""
    for tier in tiers:
        if tier.name not in TIER_NAMES:
            raise TierConfigError(f"unknown tier {tier.name!r} (tiers: {', '.join(TIER_NAMES)})")
        if tier.variant and tier.variant not in variants:
            raise TierConfigError(f"tier {tier.name} names unknown variant {tier.variant}")
        if tier.max_cost < 0:
            raise TierConfigError(f"tier {tier.name} max_cost must be >= 0")
    served = served_variants(tiers, default_variant)
    if len(set(served.values())) > 1 and not mixed:
        each = ", ".join(f"{name}: {variant}" for name, variant in served.items())
        raise TierConfigError(
            f"tiers serve different variants ({each}), so an answer would depend on which "
            "tier serves the request (its cost, the load, failover). Give every tier the same "
            "variant (a caller can still name another with the `variant` parameter), or opt "
            f"in with `tiers: {{{MIXED_VARIANTS}: true, ...}}` when the model's callers accept "
            "answers that depend on the tier"
        )
