"""Token-bucket arithmetic of the per-tenant rate limit, pure: callers pass `now_ms`.

The limit that counts is the one in Redis (quota.py), shared by every gateway replica; its
Lua script does exactly this arithmetic, and the integration tests hold the two to the same
answers. A bucket holds up to `burst` tokens, refills at `rate_per_s`, and a request takes
one whole token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenBucket:
    tokens: float
    updated_ms: int


@dataclass(frozen=True, slots=True)
class Take:
    admitted: bool
    # When the next token will be there (0 when admitted).
    retry_after_ms: int
    # The state to keep: unchanged when refused (the refill is recomputed next time).
    bucket: TokenBucket | None


def take(bucket: TokenBucket | None, now_ms: int, rate_per_s: float, burst: int) -> Take:
    """Take one token from `bucket` (None: never used, i.e. full) at `now_ms`.

    A clock that steps back refills nothing and never moves `updated_ms` back, so replicas
    whose clocks disagree slightly cannot mint tokens.
    """
    if bucket is None:
        bucket = TokenBucket(float(burst), now_ms)
    tokens = available(bucket, now_ms, rate_per_s, burst)
    if tokens < 1:
        wait_ms = max(1, math.ceil((1 - tokens) * 1000 / rate_per_s))
        return Take(False, wait_ms, bucket)
    kept = TokenBucket(round(tokens - 1, 6), max(now_ms, bucket.updated_ms))
    return Take(True, 0, kept)


def available(bucket: TokenBucket, now_ms: int, rate_per_s: float, burst: int) -> float:
    """The tokens in `bucket` at `now_ms`, refilled since it was last taken from."""
    elapsed = max(0, now_ms - bucket.updated_ms)
    return min(float(burst), bucket.tokens + elapsed * rate_per_s / 1000)


def idle_ms_to_full(rate_per_s: float, burst: int) -> int:
    """After this long unused a bucket is full again, the same as no bucket: Redis may forget
    it then (its key's TTL)."""
    return math.ceil(burst * 1000 / rate_per_s)
