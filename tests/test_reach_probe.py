"""The probe between retries (remote/nodes/reach_probe.py) against real TCP listeners on this machine:
a port that opens cuts the wait short; one that already answered is left to the backoff."""

from __future__ import annotations

import asyncio
import socket

from homegpu.remote.nodes.reach_probe import pause_until_reachable, port_answers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def listener(port: int, accepted: list[int]) -> asyncio.Server:
    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(port)
        writer.close()
    return await asyncio.start_server(count, "127.0.0.1", port)


async def test_a_port_that_opens_during_the_wait_ends_it() -> None:
    port, accepted = free_port(), []
    assert not await port_answers("127.0.0.1", port)
    waiting = asyncio.create_task(pause_until_reachable(asyncio.Event(), 600, ("127.0.0.1", port)))
    await asyncio.sleep(1.5)
    assert not waiting.done()
    server = await listener(port, accepted)
    try:
        await asyncio.wait_for(waiting, 30)  # well before its 600 s: the port opening ended it
        assert accepted
    finally:
        server.close()


async def test_a_port_that_answers_from_the_start_is_tried_once_and_the_wake_still_ends_the_wait() -> None:
    port, accepted = free_port(), []
    server = await listener(port, accepted)
    wake = asyncio.Event()
    try:
        waiting = asyncio.create_task(pause_until_reachable(wake, 600, ("127.0.0.1", port)))
        await asyncio.sleep(3.5)  # three probe periods: an edge-triggered probe looked once
        assert not waiting.done() and len(accepted) == 1
        wake.set()
        await asyncio.wait_for(waiting, 30)
    finally:
        server.close()
