"""Failed authentication, throttled per address: a caller that keeps presenting bad keys is
refused before its key is even looked at, for a while, on this gateway.

Each failed authentication takes a token from its address's bucket (limits.py's arithmetic:
`FAILURES_BURST` tokens, refilled at `FAILURES_PER_S`); an address whose bucket is empty is
refused RESOURCE_EXHAUSTED with the time until its next token. Addresses are kept in memory,
at most `MAX_ADDRESSES` of them (the oldest forgotten first): an attacker with many
addresses costs a bounded table, not a growing one. Callers behind one address (a NAT) share
its bucket: a legitimate tenant there waits out an attack from the same address.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tiermesh.gateway.limits import TokenBucket, available, take

FAILURES_BURST = 20
FAILURES_PER_S = 1.0
MAX_ADDRESSES = 10_000


def peer_address(peer: str) -> str:
    """The address of a call's peer, without its port: gRPC's `ipv4:1.2.3.4:5678` and
    `ipv6:[::1]:5678`, the REST door's `http:1.2.3.4`; anything else as it is."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        return rest.rpartition("]")[0].lstrip("[") or rest
    if kind == "http":
        return rest
    return peer


class FailedAuth:
    """The buckets of the addresses that failed to authenticate lately."""

    def __init__(
        self,
        burst: int = FAILURES_BURST,
        per_s: float = FAILURES_PER_S,
        max_addresses: int = MAX_ADDRESSES,
        clock_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self._burst = burst
        self._per_s = per_s
        self._max = max_addresses
        self._clock_ms = clock_ms
        self._buckets: dict[str, TokenBucket] = {}

    def wait_ms(self, address: str) -> int:
        """0 when `address` may try a key; else how long until it may."""
        bucket = self._buckets.get(address)
        if bucket is None:
            return 0
        now = self._clock_ms()
        if available(bucket, now, self._per_s, self._burst) >= 1:
            return 0
        return take(bucket, now, self._per_s, self._burst).retry_after_ms

    def failed(self, address: str) -> None:
        """Count a failed authentication of `address`."""
        taken = take(self._buckets.pop(address, None), self._clock_ms(), self._per_s, self._burst)
        if taken.bucket is not None:
            self._buckets[address] = taken.bucket  # the newest last: the oldest go first
        while len(self._buckets) > self._max:
            del self._buckets[next(iter(self._buckets))]

    def __len__(self) -> int:
        return len(self._buckets)
