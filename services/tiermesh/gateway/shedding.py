"""Load shedding at the gateway: after the router refused a (model, variant, priority)
for lack of room or time, the gateway refuses that class itself for a short while, without
the router hop or tokenization. Other priorities are untouched, so a low-priority flood
does not make high-priority traffic queue behind its refusals. Pure: callers pass `now`."""

from __future__ import annotations

# Longest a class is shed after one refusal, whatever retry-after the router suggested.
MAX_SHED_MS = 100
ShedKey = tuple[str, str, int]


class Shedder:
    def __init__(self, max_shed_ms: int = MAX_SHED_MS) -> None:
        self._max_shed_ns = max_shed_ms * 1_000_000
        self._until: dict[ShedKey, int] = {}
        # Refusals for lack of time: (shed until, when the queue ahead was estimated done).
        self._late: dict[ShedKey, tuple[int, int]] = {}

    def refused(
        self, key: ShedKey, retry_after_ms: int | None, now_ns: int, late: bool = False
    ) -> None:
        """Called when the router refused a request of this class: its queue was full, or
        (`late`) the queue ahead needed `retry_after_ms`, more than the request had left."""
        shed_ns = min((retry_after_ms or 0) * 1_000_000, self._max_shed_ns)
        if shed_ns <= 0:
            return
        if late:
            # Lack of time is the refused request's own: only requests with as little time
            # left are shed (one caller's 1 us timeouts must not refuse everyone's calls).
            until, ready = self._late.get(key, (0, 0))
            done = now_ns + (retry_after_ms or 0) * 1_000_000
            self._late[key] = (max(until, now_ns + shed_ns), max(ready, done))
            return
        self._until[key] = max(self._until.get(key, 0), now_ns + shed_ns)

    def remaining_ms(self, key: ShedKey, now_ns: int, deadline_ns: int | None = None) -> int:
        """How much longer this class is shed for a request due by `deadline_ns` (0: admit
        it); without a deadline, a class shed for lack of time counts as shed."""
        return max(self._full_ms(key, now_ns), self._late_ms(key, now_ns, deadline_ns))

    def _full_ms(self, key: ShedKey, now_ns: int) -> int:
        until = self._until.get(key, 0)
        if until <= now_ns:
            self._until.pop(key, None)
            return 0
        return max(1, (until - now_ns) // 1_000_000)

    def _late_ms(self, key: ShedKey, now_ns: int, deadline_ns: int | None) -> int:
        until, ready = self._late.get(key, (0, 0))
        if until <= now_ns:
            self._late.pop(key, None)
            return 0
        if deadline_ns is not None and deadline_ns >= ready:
            return 0  # enough time left to wait for the queue ahead
        return max(1, (until - now_ns) // 1_000_000)
