"""Pure summaries of a run's records: percentiles, groups, time breakdown, time series.

Latency percentiles count answered (OK) requests only; the error rate is failed / sent;
throughput is answered requests per second of the run's wall time. Requests an open loop
never sent (client cap) are counted apart and enter neither.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from tiermesh.bench.records import STAGES, Record

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
PERCENTILES = (50, 95, 99)
UNKNOWN_BUCKET = "unknown"
# Client latency the server's stages do not account for: the client <-> gateway hop,
# the gateway's decoding and encoding, tritonclient itself.
OUTSIDE = "outside"


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (as
    numpy's default); NaN for no values."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside 0..100")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


@dataclass(frozen=True)
class Figures:
    sent: int
    ok: int
    errors: int
    not_sent: int
    error_rate: float
    throughput_rps: float
    sent_rps: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    errors_by_code: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def figures(records: Sequence[Record], wall_s: float) -> Figures:
    """Counts, rates and latency percentiles of `records` over `wall_s` seconds."""
    sent = [r for r in records if r.sent]
    latencies = [r.outcome.latency_ms for r in sent if r.ok]
    codes = Counter(r.outcome.code for r in sent if not r.ok)
    pct = {q: percentile(latencies, q) for q in PERCENTILES}
    return Figures(
        sent=len(sent),
        ok=len(latencies),
        errors=sum(codes.values()),
        not_sent=len(records) - len(sent),
        error_rate=ratio(sum(codes.values()), len(sent)) if sent else 0.0,
        throughput_rps=ratio(len(latencies), wall_s) if wall_s > 0 else 0.0,
        sent_rps=ratio(len(sent), wall_s) if wall_s > 0 else 0.0,
        p50_ms=pct[50],
        p95_ms=pct[95],
        p99_ms=pct[99],
        mean_ms=mean(latencies),
        max_ms=max(latencies, default=math.nan),
        errors_by_code=dict(sorted(codes.items())),
    )


def group_by(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    groups: dict[K, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)


def bucket_labels(records: Sequence[Record]) -> list[str]:
    """The length bucket of each record, as a string. Answered requests carry it; a failed
    one gets the bucket answered requests of its length class landed in most often, or
    `unknown` when none of its class was answered with a bucket."""
    seen: dict[str, Counter[int]] = defaultdict(Counter)
    for r in records:
        if r.outcome.reply is not None and r.outcome.reply.bucket is not None:
            seen[r.length][r.outcome.reply.bucket] += 1
    usual = {length: counts.most_common(1)[0][0] for length, counts in seen.items()}
    out = []
    for r in records:
        bucket = r.outcome.reply.bucket if r.outcome.reply is not None else None
        if bucket is None:
            bucket = usual.get(r.length)
        out.append(UNKNOWN_BUCKET if bucket is None else str(bucket))
    return out


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers first in numeric order, then strings."""
    text = str(value)
    return (0, int(text)) if text.lstrip("-").isdigit() else (1, text)


def grouped(
    records: Sequence[Record],
    wall_s: float,
    keys: dict[str, Sequence[Any]],
) -> list[dict[str, Any]]:
    """Figures per combination of key values; `keys` maps a key name to each record's
    value (aligned with `records`). Rows sorted by key values."""
    names = list(keys)
    groups: dict[tuple[Any, ...], list[Record]] = defaultdict(list)
    for i, r in enumerate(records):
        groups[tuple(keys[n][i] for n in names)].append(r)
    rows = []
    for combo in sorted(groups, key=lambda c: [_sort_key(v) for v in c]):
        rows.append(
            {**dict(zip(names, combo, strict=True)), **figures(groups[combo], wall_s).as_dict()}
        )
    return rows


def breakdown(records: Sequence[Record], buckets: Sequence[str]) -> dict[str, dict[str, float]]:
    """Mean milliseconds per server stage for answered requests, per bucket; a stage a
    reply did not report counts as absent, not 0. `outside` is the mean client latency
    minus the mean of the sum of reported stages, `server_total` the mean `total_ms` the
    mesh reported, `latency` the client's mean; `n` the answered requests."""
    per: dict[str, list[Record]] = defaultdict(list)
    for r, b in zip(records, buckets, strict=True):
        if r.ok and r.outcome.reply is not None:
            per[b].append(r)
    out: dict[str, dict[str, float]] = {}
    for bucket in sorted(per, key=_sort_key):
        rows = per[bucket]
        stages: dict[str, float] = {}
        for stage in STAGES:
            values = [
                r.outcome.reply.stages_ms[stage]
                for r in rows
                if r.outcome.reply is not None and stage in r.outcome.reply.stages_ms
            ]
            if values:
                stages[stage] = mean(values)
        inside = [
            math.fsum(r.outcome.reply.stages_ms.values())
            for r in rows
            if r.outcome.reply is not None
        ]
        outside = mean([r.outcome.latency_ms for r in rows]) - mean(inside) if stages else math.nan
        totals = [
            r.outcome.reply.total_ms
            for r in rows
            if r.outcome.reply is not None and r.outcome.reply.total_ms is not None
        ]
        out[bucket] = {
            **stages,
            OUTSIDE: outside,
            "server_total": mean(totals),
            "latency": mean([r.outcome.latency_ms for r in rows]),
        }
        out[bucket]["n"] = float(len(rows))
    return out


def server_figures(records: Sequence[Record]) -> dict[str, Any]:
    """Where answered requests ran and how they were batched, from their replies."""
    replies = [r.outcome.reply for r in records if r.ok and r.outcome.reply is not None]
    batches = [rep.batch_size for rep in replies if rep.batch_size]
    tokens = sum(rep.tokens or 0 for rep in replies if rep.padded_tokens is not None)
    padded = sum(rep.padded_tokens or 0 for rep in replies if rep.tokens is not None)
    return {
        "tiers": dict(Counter(rep.tier for rep in replies if rep.tier)),
        "variants": dict(Counter(rep.variant for rep in replies if rep.variant)),
        "workers": dict(Counter(rep.worker for rep in replies if rep.worker)),
        # A batch of b answers b requests that each report b: requests / batches.
        "mean_batch_size": ratio(len(batches), math.fsum(1.0 / b for b in batches)),
        "padding_ratio": ratio(padded, tokens),
        "replies_with_timings": sum(1 for rep in replies if rep.stages_ms),
    }


def timeline(records: Sequence[Record], window_s: float, wall_s: float) -> list[dict[str, float]]:
    """Per window of `window_s`: requests sent per second by send time; answered and
    failed per second, p50 and p99 (ms) by completion time; the most requests in flight
    at once. `t_s` is the window's start, `len_s` its length (the last window runs to
    the end: half to one and a half windows)."""
    if window_s <= 0:
        raise ValueError("window must be > 0")
    count = max(1, math.ceil(wall_s / window_s - 1e-9)) if wall_s > 0 else 1
    if count > 1 and wall_s - (count - 1) * window_s < window_s / 2:
        count -= 1  # a short tail joins the window before it rather than make a noisy point

    def index(t: float) -> int:
        return min(max(int(t // window_s), 0), count - 1)

    sent = Counter(index(r.start_s) for r in records if r.sent)
    done = group_by((r for r in records if r.sent), lambda r: index(r.end_s))
    peaks = in_flight_peaks(records, window_s, count)
    out = []
    for w in range(count):
        length = window_s if w < count - 1 or wall_s <= 0 else wall_s - w * window_s
        rows = done.get(w, [])
        ok = [r.outcome.latency_ms for r in rows if r.ok]
        out.append(
            {
                "t_s": w * window_s,
                "len_s": length,
                "sent_rps": sent[w] / length,
                "throughput_rps": len(ok) / length,
                "errors_rps": (len(rows) - len(ok)) / length,
                "p50_ms": percentile(ok, 50),
                "p99_ms": percentile(ok, 99),
                "in_flight_max": float(peaks[w]),
            }
        )
    return out


def in_flight_peaks(records: Sequence[Record], window_s: float, count: int) -> list[int]:
    """The most sent requests in flight at once in each window (a sweep over start and
    end events; an end sorts before a start at the same instant)."""
    events = sorted(
        [(r.start_s, 1) for r in records if r.sent] + [(r.end_s, -1) for r in records if r.sent]
    )
    peaks = [0] * count
    current = 0
    w = 0
    for t, delta in events:
        idx = min(max(int(t // window_s), 0), count - 1)
        while w < idx:  # what was in flight at the end of a window is there at the next
            w += 1
            peaks[w] = max(peaks[w], current)
        current += delta
        peaks[w] = max(peaks[w], current)
    return peaks


def drift(windows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Throughput and p99 of the last third of the windows over the first third (1.0: no
    drift); NaN with fewer than six windows, where a third is too short to say."""
    third = len(windows) // 3
    if third < 2:
        return {"throughput_ratio": math.nan, "p99_ratio": math.nan}
    first, last = windows[:third], windows[-third:]

    def avg(rows: Sequence[dict[str, float]], key: str) -> float:
        return mean([row[key] for row in rows if not math.isnan(row[key])])

    return {
        "throughput_ratio": ratio(avg(last, "throughput_rps"), avg(first, "throughput_rps")),
        "p99_ratio": ratio(avg(last, "p99_ms"), avg(first, "p99_ms")),
    }


def lag_figures(records: Sequence[Record]) -> dict[str, float]:
    """How late an open loop sent against its schedule: if p99 is large, the client could
    not keep the rate and the offered load was lower than asked."""
    lags = [r.lag_ms for r in records]
    return {
        "p50_ms": percentile(lags, 50),
        "p99_ms": percentile(lags, 99),
        "max_ms": max(lags, default=math.nan),
    }


def retry_after(records: Sequence[Record]) -> dict[str, float]:
    values = [r.outcome.retry_after_ms for r in records if r.outcome.retry_after_ms is not None]
    return {
        "count": float(len(values)),
        "mean_ms": mean(values),
        "max_ms": max(values, default=math.nan),
    }
