"""What the gateways saw of each (model, version), in per-second buckets, as plain values.

A gateway counts answers in memory (`WindowCounts`) and flushes them every few hundred ms
as increments of one Redis hash per (model, version, second): no Redis call per request.
Fields of a bucket: `n` answers, `c:{CODE}` answers by status code, `l:{i}` OK answers by
latency bucket i (log-spaced, 25% wide), `cs`/`cn` sum and count of output cosine
similarities to stable (mirrored requests, recorded on the canary's version).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Latency buckets: upper bound of bucket i is LAT_BASE_MS * LAT_FACTOR**i; the last one
# takes everything longer (about 73 s).
LAT_BASE_MS = 0.1
LAT_FACTOR = 1.25
LAT_BUCKETS = 62
# Answers that say nothing about the version: the caller gave up.
NEUTRAL_CODES = frozenset({"CANCELLED"})
# Buckets outlive any sensible window; `tiermesh rollout status` reads them too.
BUCKET_TTL_S = 900


def latency_bucket(ms: float) -> int:
    if ms <= LAT_BASE_MS:
        return 0
    return min(math.ceil(math.log(ms / LAT_BASE_MS, LAT_FACTOR) - 1e-9), LAT_BUCKETS - 1)


def bucket_upper_ms(i: int) -> float:
    return float(LAT_BASE_MS * LAT_FACTOR**i)


BucketId = tuple[str, str, int]  # (model, version, unix second)


@dataclass
class WindowCounts:
    """Counts not yet flushed; owned by one gateway's event loop."""

    ints: defaultdict[BucketId, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    floats: defaultdict[BucketId, dict[str, float]] = field(
        default_factory=lambda: defaultdict(dict)
    )

    def outcome(
        self, model: str, version: str, second: int, code: str, latency_ms: float | None
    ) -> None:
        c = self.ints[(model, version, second)]
        c["n"] += 1
        c[f"c:{code}"] += 1
        if code == "OK" and latency_ms is not None:
            c[f"l:{latency_bucket(latency_ms)}"] += 1

    def cosine(self, model: str, version: str, second: int, value: float) -> None:
        self.ints[(model, version, second)]["cn"] += 1
        sums = self.floats[(model, version, second)]
        sums["cs"] = sums.get("cs", 0.0) + value

    def merge(
        self, ints: dict[BucketId, Counter[str]], floats: dict[BucketId, dict[str, float]]
    ) -> None:
        """Put drained counts back (a flush that failed), adding to what came since."""
        for bucket, counts in ints.items():
            self.ints[bucket].update(counts)
        for bucket, values in floats.items():
            sums = self.floats[bucket]
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value

    def drain(self) -> tuple[dict[BucketId, Counter[str]], dict[BucketId, dict[str, float]]]:
        """Everything counted so far; the counts start again from zero."""
        ints, floats = dict(self.ints), dict(self.floats)
        self.ints.clear()
        self.floats.clear()
        return ints, floats

    def __bool__(self) -> bool:
        return bool(self.ints)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One version's answers over a window."""

    answers: int = 0  # not counting NEUTRAL_CODES
    errors: int = 0
    codes: Mapping[str, int] = field(default_factory=dict)
    latency: Mapping[int, int] = field(default_factory=dict)  # bucket -> OK answers
    cosine_sum: float = 0.0
    cosine_n: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.answers if self.answers else 0.0

    @property
    def ok(self) -> int:
        return int(self.codes.get("OK", 0))

    @property
    def cosine_mean(self) -> float | None:
        return self.cosine_sum / self.cosine_n if self.cosine_n else None

    def p99_ms(self) -> float | None:
        """Upper bound of the bucket holding the 99th percentile OK latency."""
        return self.quantile_ms(0.99)

    def quantile_ms(self, q: float) -> float | None:
        total = sum(self.latency.values())
        if total == 0:
            return None
        rank = math.ceil(q * total)
        seen = 0
        for i in sorted(self.latency):
            seen += self.latency[i]
            if seen >= rank:
                return bucket_upper_ms(i)
        return bucket_upper_ms(max(self.latency))


def stats_of(buckets: Iterable[Mapping[str, str]]) -> WindowStats:
    """Sum the per-second hashes of one version (as strings, the way Redis returns them)."""
    codes: Counter[str] = Counter()
    latency: Counter[int] = Counter()
    cs, cn = 0.0, 0
    for raw in buckets:
        for key, value in raw.items():
            if key.startswith("c:"):
                codes[key[2:]] += int(value)
            elif key.startswith("l:"):
                latency[int(key[2:])] += int(value)
            elif key == "cs":
                cs += float(value)
            elif key == "cn":
                cn += int(value)
    answers = sum(n for code, n in codes.items() if code not in NEUTRAL_CODES)
    return WindowStats(
        answers=answers,
        errors=answers - codes.get("OK", 0),
        codes=dict(codes),
        latency=dict(latency),
        cosine_sum=cs,
        cosine_n=cn,
    )


def window_seconds(now_s: float, window_s: float, since_ms: int = 0) -> range:
    """The unix seconds a window ending now covers, none before `since_ms`."""
    end = int(now_s)
    start = max(end - max(math.ceil(window_s), 1) + 1, since_ms // 1000)
    return range(start, end + 1)
