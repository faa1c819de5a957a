"""settle_heap: what start-up made leaves the collector's passes."""

from __future__ import annotations

import gc

from tiermesh.core.heap import settle_heap


def test_settle_heap_freezes_what_is_alive() -> None:
    kept = [object() for _ in range(1000)]
    try:
        settle_heap({"port": 1})
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0
