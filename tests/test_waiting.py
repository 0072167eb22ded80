"""wait_set and wait_condition: a cancel that arrives in the same loop pass as the event is never lost.

Python 3.11's asyncio.wait_for lost it (the queue runner's close() then hung for good in CI: its loop
waited on an event that the cancelled start task's `finally` set)."""

from __future__ import annotations

import asyncio

import pytest

from homegpu.remote.nodes.waiting import wait_condition, wait_set


async def waiting_forever(event: asyncio.Event) -> None:
    """A runner's loop: look, then wait for a wake or the tick."""
    while True:
        await wait_set(event, 0.2)
        event.clear()


async def test_a_cancel_that_comes_with_the_wake_ends_the_loop():
    event = asyncio.Event()
    loop_task = asyncio.create_task(waiting_forever(event))
    await asyncio.sleep(0.05)  # the loop is waiting
    event.set()  # a task being cancelled wakes the runner in its `finally` ...
    loop_task.cancel()  # ... as the runner's loop is cancelled: same pass
    done, _ = await asyncio.wait([loop_task], timeout=2)
    assert done and loop_task.cancelled(), "the cancel was lost: the loop went on"


async def test_wait_set_says_whether_the_event_came():
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    asyncio.get_running_loop().call_later(0.01, event.set)
    assert await wait_set(event, 5) is True


async def test_wait_condition_holds_or_times_out():
    condition, state = asyncio.Condition(), {"ready": False}

    async def make_ready():
        async with condition:
            state["ready"] = True
            condition.notify_all()

    with pytest.raises(TimeoutError):
        await wait_condition(condition, lambda: state["ready"], 0.01)
    asyncio.get_running_loop().call_later(0.01, lambda: asyncio.ensure_future(make_ready()))
    await wait_condition(condition, lambda: state["ready"], 5)
    assert not condition.locked()
