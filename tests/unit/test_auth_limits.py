"""Token-bucket arithmetic of the per-tenant rate limit (the reference quota.py's Lua follows)."""

from __future__ import annotations

from tiermesh.gateway.limits import TokenBucket, take


def run(times_ms: list[int], rate: float, burst: int) -> list[int]:
    """retry-after of each request at the given times (0 = admitted)."""
    bucket: TokenBucket | None = None
    out = []
    for now in times_ms:
        t = take(bucket, now, rate, burst)
        bucket = t.bucket
        out.append(t.retry_after_ms)
    return out


def test_a_fresh_bucket_admits_a_burst_then_refuses() -> None:
    assert run([0, 0, 0, 0], rate=1, burst=3) == [0, 0, 0, 1000]


def test_refill_follows_the_rate_and_retry_after_says_when() -> None:
    # 10/s: one token per 100 ms.
    assert run([0, 0, 40, 100, 100], rate=10, burst=1) == [0, 100, 60, 0, 100]


def test_refill_never_exceeds_the_burst() -> None:
    assert run([0, 0, 10_000, 10_000, 10_000], rate=10, burst=2) == [0, 0, 0, 0, 100]


def test_a_refusal_takes_nothing() -> None:
    bucket = TokenBucket(0.5, 0)
    refused = take(bucket, 0, 1, 5)
    assert not refused.admitted and refused.bucket == bucket
    assert refused.retry_after_ms == 500


def test_a_clock_stepping_back_mints_no_tokens() -> None:
    first = take(None, 1000, rate_per_s=1, burst=1)
    assert first.admitted
    back = take(first.bucket, 0, rate_per_s=1, burst=1)  # another replica's clock is behind
    assert not back.admitted and back.retry_after_ms == 1000
    assert take(first.bucket, 2000, rate_per_s=1, burst=1).bucket == TokenBucket(0.0, 2000)


def test_slow_rates_wait_whole_milliseconds() -> None:
    assert run([0, 1], rate=0.3, burst=1) == [0, 3333]
