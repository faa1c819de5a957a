"""Figures as text and markdown tables: what summary.md (bench/markdown.py, with
bench/genmarkdown.py) and the console lines are built of."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DASH = "-"


def fmt(value: Any, digits: int | str = 2) -> str:
    if value is None:
        return DASH
    if digits == "%":
        return f"{float(value):.2%}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if digits == 0 or isinstance(value, int):
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def shares(values: Mapping[str, float]) -> str:
    """`{"a": 0.7, "b": 0.3}` -> `a=0.70, b=0.30`."""
    return ", ".join(f"{k}={v:.2f}" for k, v in values.items())
