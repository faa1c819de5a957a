"""Restart backoff of `tiermesh up`: doubling delays, capped, reset after a healthy run."""

from __future__ import annotations

import pytest

from tiermesh.up.restarts import Backoff, RestartPolicy, next_wake_s

POLICY = RestartPolicy(base_s=0.5, max_s=4.0, reset_after_s=60.0)


def test_delays_double_and_are_capped() -> None:
    assert [POLICY.delay_s(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    with pytest.raises(ValueError):
        POLICY.delay_s(0)


def test_a_crash_loop_backs_off_and_a_healthy_run_resets_it() -> None:
    b = Backoff(POLICY, started_at=0.0)
    assert b.exited(1.0) == 0.5
    assert not b.due(1.4) and b.due(1.5)
    b.restarted(1.5)
    assert b.due_at is None and b.restarts == 1
    assert b.exited(2.0) == 1.0  # died again quickly: twice the wait
    b.restarted(3.0)
    assert b.exited(3.1) == 2.0
    b.restarted(5.1)
    # Up for a minute before this crash: back to the first delay.
    assert b.exited(5.1 + 61.0) == 0.5
    assert b.crashes == 1


def test_next_wake_is_the_earliest_pending_restart() -> None:
    a, b, c = (Backoff(POLICY, started_at=0.0) for _ in range(3))
    assert next_wake_s([a, b, c], 10.0) is None
    a.exited(10.0)  # due at 10.5
    b.exited(10.0)
    b.restarted(10.5)
    b.exited(10.6)  # second crash: due at 11.6
    assert next_wake_s([a, b, c], 10.2) == pytest.approx(0.3)
    assert next_wake_s([a, b, c], 11.0) == 0.0  # overdue: wake at once
