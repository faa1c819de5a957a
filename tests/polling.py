"""Waiting for something to become true in a test: poll with a deadline, never a bare sleep.
A timeout fails the test with what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    check: Callable[[], T], what: str, timeout_s: float = 30, interval_s: float = 0.05
) -> T:
    """Call `check` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval_s)
    return found


async def until(
    check: Callable[[], Awaitable[object]],
    what: str,
    timeout_s: float = 20,
    interval_s: float = 0.02,
) -> None:
    """Await `check` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(interval_s)
