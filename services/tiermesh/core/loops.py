"""Periodic background loops (flushers, pollers) and their stop."""

from __future__ import annotations

import asyncio


def raise_if_cancelling() -> None:
    """Called after each round of a loop that talks to Redis. redis-py can swallow a
    cancellation that lands in mid-command (or turn it into a connection error), and the
    loop would then sleep on for ever and hang its service's stop; this ends it."""
    if (task := asyncio.current_task()) is not None and task.cancelling():
        raise asyncio.CancelledError
