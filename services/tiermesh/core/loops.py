"""Periodic background loops (flushers, pollers) and their stop."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis


def raise_if_cancelling() -> None:
    """Called after each round of a loop that talks to Redis. redis-py can swallow a
    cancellation that lands in mid-command (or turn it into a connection error), and the
    loop would then sleep on for ever and hang its service's stop; this ends it."""
    if (task := asyncio.current_task()) is not None and task.cancelling():
        raise asyncio.CancelledError


async def repeat(
    round_: Callable[[], Awaitable[object]],
    interval_s: Callable[[], float],
    failed: Callable[[Exception], None],
) -> None:
    """`round_` until cancelled, `interval_s()` apart; a round that meets Redis trouble
    (a Redis error, an OSError) is reported to `failed`, and the next one retries."""
    while True:
        try:
            await round_()
        except (aioredis.RedisError, OSError) as exc:
            failed(exc)
        raise_if_cancelling()
        await asyncio.sleep(interval_s())


def lock_owner() -> str:
    """A lock holder's name (a loop that holds a Redis lock while it works): this process,
    and a part of its own."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
