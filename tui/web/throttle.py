"""Wrong tokens slowed per client, so that guessing the web view's token is not a race.

Without it an answer to a wrong token takes under a millisecond: a thousand guesses a second from
one machine. Each client (by peer address) that keeps guessing now waits twice as long as for its
last wrong guess, up to `cap` seconds, and its wrong answers are queued one after another: opening
many connections at once does not guess faster. The right token is never delayed and ends the
client's penalty. Memory is bounded: at most `clients` clients are remembered, the least recent
forgotten first.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

FIRST_DELAY = 0.05  # seconds: a person's mistyped token is not noticed
MAX_DELAY = 3.0  # from the 7th wrong guess on: about 20 guesses a minute at most
MAX_CLIENTS = 1024


class Throttle:
    """The delays owed by clients that gave wrong tokens. `clock` and `sleep` are injectable for tests."""

    def __init__(self, first: float = FIRST_DELAY, cap: float = MAX_DELAY, clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.first, self.cap, self.clients = first, cap, clients
        self._clock, self._sleep = clock, sleep
        self._owed: dict[str, tuple[float, float]] = {}  # client -> (its last delay, when its last answer goes)

    async def wrong(self, client: str) -> None:
        """Wait before a wrong token's answer: `first`, then twice the last delay up to `cap`, counted from
        this client's previous wrong answer if that is still waiting."""
        await self._sleep(self._schedule(client))

    def right(self, client: str) -> None:
        """The right token: this client starts over."""
        self._owed.pop(client, None)

    def _schedule(self, client: str) -> float:
        """Seconds from now until this wrong answer may go; remembers the client as the most recent."""
        now = self._clock()
        last = self._owed.pop(client, None)  # popped and put back: the dict's order is by recency
        delay = min(last[0] * 2, self.cap) if last else self.first
        at = max(now, last[1] if last else now) + delay
        self._owed[client] = (delay, at)
        if len(self._owed) > self.clients:
            del self._owed[next(iter(self._owed))]
        return at - now
