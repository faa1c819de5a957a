"""Entries this worker computed and has not acknowledged yet: their results are being
passed on, or could not be (the hand-off kept failing, the batch job's bookkeeping or the
acknowledgement did not reach Redis) and they stay pending. Such an entry may come back
(a reclaim once it idled long enough), each return counted as a delivery, yet it never
failed in the model: however often that happens it is no poison (worker/membership.py) -
as when a Redis Cluster's slot holding the batch bookkeeping fails over for longer than a
reclaim's idle time."""

from __future__ import annotations

from collections.abc import Iterable

from tiermesh.core.keys import StreamKey

# Kept at most (oldest forgotten first): a few batches' worth per stream covers the entries
# one outage leaves behind.
MAX_REMEMBERED = 100_000


class Unwritten:
    """The entries (stream, entry id) computed here and not acknowledged yet."""

    def __init__(self, limit: int = MAX_REMEMBERED) -> None:
        self._entries: dict[tuple[StreamKey, str], None] = {}  # oldest first
        self._limit = limit

    def add(self, stream: StreamKey, entry_ids: Iterable[str]) -> None:
        self._entries.update(dict.fromkeys((stream, e) for e in entry_ids))
        while len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]

    def computed(self, stream: StreamKey, entry_id: str) -> bool:
        """Whether this worker computed the entry before (it is then no poison)."""
        return (stream, entry_id) in self._entries

    def forget(self, stream: StreamKey, entry_ids: Iterable[str]) -> None:
        """Acknowledged: nothing more to remember."""
        for entry_id in entry_ids:
            self._entries.pop((stream, entry_id), None)
