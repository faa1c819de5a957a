"""Pure figures of generation: a streamed request's pieces -> its client-side timings, and
the records of a run -> the report's `generation` section.

Client time to first token (TTFT) runs from sending the request to the first response
whose text is not empty; client time per output token (TPOT) is the time from that piece
to the last piece with text over the tokens after the first (`generated_tokens - 1`, as
the final response counts them). The server's own `ttft_ms` / `tpot_ms` start when a
worker took the request, so client minus server TTFT is the time spent before (gateway,
routing, queue) and on the way back. Percentiles count answered (OK) requests only;
tokens/s is their generated tokens over the run's wall time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

from tiermesh.bench.records import GenerationRecord, Record
from tiermesh.bench.stats import group_by, mean, percentile, ratio

GEN_PERCENTILES = (50, 90, 99)
# The distributions kept in the report for plots: every percentile from 0 to 100.
QUANTILE_POINTS = 101
MOST_COMMON_ERRORS = 5
# The distributions of the section, by key.
DISTRIBUTIONS = ("ttft_ms", "tpot_ms", "server_ttft_ms", "server_tpot_ms", "e2e_ms")
# The answered (OK) requests of a run with their GenerationRecord.
Answered: TypeAlias = list[tuple[Record, GenerationRecord]]


class Pieces:
    """The responses of one streamed request as they arrived, on the sender's clock (s).
    `add` is called once per response, the final one included, in arrival order;
    `last_s` is the latest arrival (the start before any)."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.last_s = start_s
        self.first_text_s: float | None = None
        self.last_text_s: float | None = None
        self.count = 0
        self.chars = 0

    def add(self, at_s: float, text: str) -> None:
        self.count += 1
        self.last_s = at_s
        if not text:
            return
        self.chars += len(text)
        if self.first_text_s is None:
            self.first_text_s = at_s
        self.last_text_s = at_s

    def ttft_ms(self) -> float | None:
        if self.first_text_s is None:
            return None
        return (self.first_text_s - self.start_s) * 1e3

    def tpot_ms(self, tokens: int | None) -> float | None:
        return tpot_ms(self.first_text_s, self.last_text_s, tokens)


def tpot_ms(first_s: float | None, last_s: float | None, tokens: int | None) -> float | None:
    """(last - first) / (tokens - 1) in ms; None without two tokens or without pieces."""
    if first_s is None or last_s is None or tokens is None or tokens < 2:
        return None
    return (last_s - first_s) * 1e3 / (tokens - 1)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def generation_of(
    max_new_tokens: int,
    pieces: Pieces,
    final: Mapping[str, Any] | None = None,
    error: str = "",
    streamed: bool = True,
) -> GenerationRecord:
    """A request's GenerationRecord from its pieces and its final response's parameter values
    (None when no final response came). Unstreamed (one response), the client's TTFT is
    the whole call and there is no client TPOT."""
    values = final or {}
    generated = _int(values.get("generated_tokens"))
    reason = values.get("finish_reason")
    return GenerationRecord(
        max_new_tokens=max_new_tokens,
        ttft_ms=pieces.ttft_ms(),
        tpot_ms=pieces.tpot_ms(generated) if streamed else None,
        pieces=pieces.count,
        text_chars=pieces.chars,
        generated_tokens=generated,
        prompt_tokens=_int(values.get("prompt_tokens")),
        server_ttft_ms=_float(values.get("ttft_ms")),
        server_tpot_ms=_float(values.get("tpot_ms")),
        finish_reason=reason if isinstance(reason, str) else "",
        error=error,
    )


def distribution(values: Sequence[float]) -> dict[str, float]:
    """Count, p50 / p90 / p99, mean and max (NaN without values)."""
    out: dict[str, float] = {"n": float(len(values))}
    for q in GEN_PERCENTILES:
        out[f"p{q}"] = percentile(values, q)
    out["mean"] = mean(values)
    out["max"] = max(values, default=math.nan)
    return out


def quantiles(values: Sequence[float], points: int = QUANTILE_POINTS) -> list[list[float]]:
    """[[q, value], ...] for q evenly from 0 to 100: a distribution small enough to keep."""
    if not values:
        return []
    ordered = sorted(values)
    qs = [100.0 * i / (points - 1) for i in range(points)]
    return [[q, percentile(ordered, q)] for q in qs]


def _answered(records: Sequence[Record]) -> Answered:
    return [(r, r.outcome.generation) for r in records if r.ok and r.outcome.generation is not None]


def samples(answered: Answered) -> dict[str, list[float]]:
    """Each distribution's values over the answered requests that have one."""
    out: dict[str, list[float]] = {key: [] for key in DISTRIBUTIONS}
    for r, g in answered:
        for key, value in (
            ("ttft_ms", g.ttft_ms),
            ("tpot_ms", g.tpot_ms),
            ("server_ttft_ms", g.server_ttft_ms),
            ("server_tpot_ms", g.server_tpot_ms),
            ("e2e_ms", r.outcome.latency_ms),
        ):
            if value is not None:
                out[key].append(value)
    return out


def _tokens(gens: Sequence[GenerationRecord], attr: str) -> dict[str, float]:
    values = [v for g in gens if (v := getattr(g, attr)) is not None]
    return {
        "total": float(sum(values)),
        "mean": mean(values),
        "p50": percentile(values, 50),
        "max": max(values, default=math.nan),
    }


def _by_class(answered: Answered, wall_s: float) -> list[dict[str, Any]]:
    """Per answer-length class (the record's length label), in ascending order."""
    rows = []
    groups = group_by(answered, lambda pair: pair[0].length)
    for label in sorted(groups, key=_class_key):
        group = groups[label]
        values = samples(group)
        tokens = [g.generated_tokens for _, g in group if g.generated_tokens is not None]
        rows.append(
            {
                "max_new_tokens": label,
                "ok": len(group),
                "mean_generated_tokens": mean(tokens),
                "tokens_per_s": ratio(sum(tokens), wall_s) if wall_s > 0 else math.nan,
                **{f"ttft_p{q}_ms": percentile(values["ttft_ms"], q) for q in GEN_PERCENTILES},
                **{f"tpot_p{q}_ms": percentile(values["tpot_ms"], q) for q in GEN_PERCENTILES},
                "e2e_p50_ms": percentile(values["e2e_ms"], 50),
                "e2e_p99_ms": percentile(values["e2e_ms"], 99),
            }
        )
    return rows


def _class_key(label: str) -> tuple[int, int, str]:
    lo, _, hi = label.partition("-")
    if lo.isdigit() and (not hi or hi.isdigit()):
        return (int(lo), int(hi or lo), "")
    return (2**62, 0, label)


def _errors(records: Sequence[Record]) -> list[dict[str, Any]]:
    counts = Counter(
        (r.outcome.code, r.outcome.generation.error if r.outcome.generation else "")
        for r in records
        if r.sent and not r.ok
    )
    return [
        {"code": code, "message": message, "count": n}
        for (code, message), n in counts.most_common(MOST_COMMON_ERRORS)
    ]


def section(records: Sequence[Record], wall_s: float, streaming: bool) -> dict[str, Any]:
    """The report's `generation` section of a generate run's records."""
    answered = _answered(records)
    gens = [g for _, g in answered]
    values = samples(answered)
    generated = _tokens(gens, "generated_tokens")
    return {
        "streaming": streaming,
        "answered": len(answered),
        **{key: distribution(values[key]) for key in DISTRIBUTIONS},
        "tokens_per_s": ratio(generated["total"], wall_s) if wall_s > 0 else math.nan,
        "generated_tokens": generated,
        "prompt_tokens": _tokens(gens, "prompt_tokens"),
        # Answered requests whose final response left out generated_tokens: no TPOT, and
        # tokens/s counts them as nothing.
        "without_token_count": sum(1 for g in gens if g.generated_tokens is None),
        "without_text": sum(1 for g in gens if g.ttft_ms is None),
        "finish_reasons": dict(Counter(g.finish_reason or "unknown" for g in gens)),
        "by_max_new_tokens": _by_class(answered, wall_s),
        "errors": _errors(records),
        "quantiles": {key: quantiles(values[key]) for key in DISTRIBUTIONS},
    }


def tokens_of(records: Sequence[Record]) -> int:
    """Prompt and generated tokens of the answered generation requests (for cost)."""
    return sum((g.prompt_tokens or 0) + (g.generated_tokens or 0) for _, g in _answered(records))
