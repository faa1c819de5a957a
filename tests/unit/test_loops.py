"""A loop whose step swallows a cancellation (as redis-py can, mid-command) still stops."""

from __future__ import annotations

import asyncio

import pytest

from tiermesh.core.loops import raise_if_cancelling


async def swallowing_step(started: asyncio.Event) -> None:
    started.set()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        pass  # what a client library may do with a cancellation that hit its read


async def test_a_swallowed_cancellation_still_ends_the_loop() -> None:
    started = asyncio.Event()

    async def loop() -> None:
        while True:
            await swallowing_step(started)
            raise_if_cancelling()  # without it this loop never ends (the test times out)

    task = asyncio.create_task(loop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
