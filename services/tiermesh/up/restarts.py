"""When `tiermesh up` restarts a process that died: exponential backoff, as Kubernetes'
CrashLoopBackOff does, reset once the process has stayed up for a while.

Pure: times are passed in, nothing here sleeps or spawns.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    # Delay before the first restart; each further consecutive crash doubles it up to max_s.
    base_s: float = 0.5
    max_s: float = 30.0
    # A process that ran this long before dying counts as healthy: the next delay is base_s.
    reset_after_s: float = 60.0

    def delay_s(self, crashes: int) -> float:
        """The wait before restarting after the `crashes`-th consecutive crash (1-based)."""
        if crashes < 1:
            raise ValueError("crashes counts from 1")
        return float(min(self.max_s, self.base_s * 2 ** (crashes - 1)))


@dataclass(slots=True)
class Backoff:
    """One process's restart state: when it started, how often it crashed in a row, and
    when it is due to be started again (None while it runs)."""

    policy: RestartPolicy
    started_at: float
    crashes: int = 0
    due_at: float | None = None
    restarts: int = 0

    def exited(self, now: float) -> float:
        """Record an exit at `now`; returns the delay before the restart."""
        if now - self.started_at >= self.policy.reset_after_s:
            self.crashes = 0
        self.crashes += 1
        delay = self.policy.delay_s(self.crashes)
        self.due_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        return self.due_at is not None and now >= self.due_at

    def restarted(self, now: float) -> None:
        self.started_at = now
        self.due_at = None
        self.restarts += 1


def next_wake_s(backoffs: list[Backoff], now: float) -> float | None:
    """Seconds until the earliest pending restart (0 when one is due), None when none is."""
    pending = [b.due_at for b in backoffs if b.due_at is not None]
    if not pending:
        return None
    return max(0.0, min(pending) - now)
