"""The canary judge: a pure function of window stats and thresholds."""

from __future__ import annotations

from tiermesh.core.canary_spec import CanarySpec
from tiermesh.rollout.judge import judge
from tiermesh.rollout.window import WindowStats, latency_bucket

SPEC = CanarySpec(
    min_requests=10, max_error_rate=0.1, max_p99_ratio=2.0, p99_floor_ms=5, min_cosine=0.99
)


def stats(
    ok: int = 0, failed: int = 0, ms: float = 2.0, cos: tuple[float, ...] = ()
) -> WindowStats:
    codes = {"OK": ok, **({"ABORTED": failed} if failed else {})}
    return WindowStats(
        answers=ok + failed,
        errors=failed,
        codes=codes,
        latency={latency_bucket(ms): ok} if ok else {},
        cosine_sum=sum(cos),
        cosine_n=len(cos),
    )


def test_too_few_canary_answers_is_insufficient_data() -> None:
    verdict = judge(stats(ok=100), stats(ok=3, failed=6), SPEC)
    assert verdict.action == "insufficient_data"


def test_error_rate_over_the_limit_rolls_back() -> None:
    verdict = judge(stats(ok=100), stats(ok=8, failed=2), SPEC)
    assert (verdict.action, verdict.reason) == ("rollback", "error_rate")
    assert "2/10" in verdict.detail


def test_error_rate_at_the_limit_holds() -> None:
    verdict = judge(stats(ok=100), stats(ok=9, failed=1), SPEC)
    assert verdict.action == "hold"


def test_cancelled_answers_do_not_count_against_the_canary() -> None:
    canary = WindowStats(answers=10, errors=0, codes={"OK": 10, "CANCELLED": 50})
    assert judge(stats(ok=100), canary, SPEC).action == "hold"


def test_output_drift_rolls_back_once_enough_pairs() -> None:
    assert judge(stats(), stats(cos=(0.5,) * 4), SPEC).action == "insufficient_data"
    verdict = judge(stats(), stats(cos=(0.5,) * 5), SPEC)
    assert (verdict.action, verdict.reason) == ("rollback", "drift")


def test_output_close_to_stable_holds() -> None:
    assert judge(stats(), stats(cos=(0.999,) * 5), SPEC).action == "hold"


def test_slow_canary_rolls_back_on_p99() -> None:
    verdict = judge(stats(ok=50, ms=20), stats(ok=50, ms=60), SPEC)
    assert (verdict.action, verdict.reason) == ("rollback", "latency")


def test_p99_of_a_fast_stable_counts_as_the_floor() -> None:
    # 0.2 ms stable vs 3 ms canary is 15x, but under 2 x the 5 ms floor: noise, not a breach.
    assert judge(stats(ok=50, ms=0.2), stats(ok=50, ms=3), SPEC).action == "hold"


def test_errors_are_judged_before_drift_and_latency() -> None:
    canary = stats(ok=5, failed=5, ms=500, cos=(0.0,) * 10)
    assert judge(stats(ok=50), canary, SPEC).reason == "error_rate"
