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

    def refused(self, key: ShedKey, retry_after_ms: int | None, now_ns: int) -> None:
        """Called when the router refused a request of this class."""
        shed_ns = min((retry_after_ms or 0) * 1_000_000, self._max_shed_ns)
        if shed_ns > 0:
            self._until[key] = max(self._until.get(key, 0), now_ns + shed_ns)

    def remaining_ms(self, key: ShedKey, now_ns: int) -> int:
        """How much longer this class is shed (0: admit it)."""
        until = self._until.get(key, 0)
        if until <= now_ns:
            self._until.pop(key, None)
            return 0
        return max(1, (until - now_ns) // 1_000_000)
