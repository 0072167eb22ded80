"""Waiting for an event with a time limit, without losing a cancel.

Python 3.11's asyncio.wait_for returns the awaited result when a cancel arrives in the same loop pass as
that result, and the cancel is lost: a loop that waits on an event which the cancelled code itself sets
(a task's `finally` waking its runner) then never ends, and whoever awaits it hangs (serve's queue runner
did, in CI). asyncio.timeout counts cancels and gives a foreign one back; everything that waits on an
event with a limit goes through here.
"""

from __future__ import annotations

import asyncio
import contextlib


async def wait_set(event: asyncio.Event, seconds: float | None) -> bool:
    """Wait until `event` is set (True) or `seconds` pass (False); a cancel always goes through."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
    return event.is_set()


async def wait_condition(condition: asyncio.Condition, predicate, seconds: float | None) -> None:
    """Wait, holding `condition`, until predicate() holds; TimeoutError after `seconds`."""
    async with condition:
        async with asyncio.timeout(seconds):
            await condition.wait_for(predicate)
