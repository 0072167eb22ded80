"""The hub that fans every published event out to its subscribers.

remote/ publishes; the TUI, the headless runner, the recorders and the alert watcher subscribe. Events
are frozen and carry the node name and a timestamp, so a consumer never has to ask a session anything.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Iterable


class EventHub:
    """Fans each published event out to every subscriber's own queue.

    Publishing never blocks: a subscriber that stops reading only grows its own queue, up to
    `max_queue`, after which its oldest events are dropped (stats are superseded every second).
    """

    def __init__(self, max_queue: int = 10_000) -> None:
        self._queues: list[asyncio.Queue] = []
        self._max_queue = max_queue
        self._derivers: list[Callable[[object], Iterable[object]]] = []

    def publish(self, event: object) -> None:
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
                queue.dropped += 1
            queue.put_nowait(event)
        for derive in self._derivers:
            for derived in derive(event):
                self.publish(derived)

    def derive(self, deriver: Callable[[object], Iterable[object]]) -> None:
        """Call `deriver` with every event as it is published, and publish what it returns right after.

        Derived events (alerts) follow their cause in every subscriber's stream, before any later
        event, so the timeline records a run's last alert before the run's recorder closes. A
        deriver runs on every event, floods of log lines included: it must be cheap, and must not
        derive from what it derived itself."""
        self._derivers.append(deriver)

    def underive(self, deriver: Callable[[object], Iterable[object]]) -> None:
        if deriver in self._derivers:
            self._derivers.remove(deriver)

    def subscribe(self) -> "Subscription":
        queue = _Queue(self._max_queue)
        self._queues.append(queue)
        return Subscription(self, queue)

    def _unsubscribe(self, queue: asyncio.Queue) -> None:
        if queue in self._queues:
            self._queues.remove(queue)


class _Queue(asyncio.Queue):
    """A subscriber's queue, counting the events it lost to a full queue."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.dropped = 0


class Subscription:
    """An async iterator over events published after it was created; close() to stop."""

    def __init__(self, hub: EventHub, queue: _Queue) -> None:
        self._hub, self._queue = hub, queue

    @property
    def dropped(self) -> int:
        """Events this subscriber lost because it read slower than they came (a flood of output)."""
        return self._queue.dropped

    def __aiter__(self) -> AsyncIterator[object]:
        return self

    async def __anext__(self) -> object:
        return await self._queue.get()

    async def get(self, timeout: float | None = None) -> object:
        async with asyncio.timeout(timeout):  # not wait_for, which can lose a cancel (waiting.py)
            return await self._queue.get()

    def drain(self, limit: int) -> list[object]:
        """Up to `limit` events already waiting, without waiting for more (to handle a flood in batches)."""
        events = []
        while len(events) < limit and not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events

    def close(self) -> None:
        self._hub._unsubscribe(self._queue)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
