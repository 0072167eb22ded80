"""The one way homegpu records hub events into a SQLite store (the run's timeline, serve's history).

`handle(event)` only buffers rows, through the handler its class names for the event's type; the buffer
is written in one transaction about once a second (never a commit per sample), so recording costs the
event loop a few microseconds per event. When a write is due is each store's own rule (`_due`): the
timeline goes by its events' time, the history by an injected clock. A subclass holds only its tables.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import sqlite3
from typing import Any, Callable, ClassVar, Mapping, Self

FLUSH_SECONDS = 1.0
WAKE_SECONDS = 0.25
WAKES_PER_FLUSH = max(1, round(FLUSH_SECONDS / WAKE_SECONDS))


class SampleRecorder(abc.ABC):
    """Records hub events into one SQLite file, as its only writer; a subclass gives its tables and rules.

    A subclass fills `_HANDLERS` (event type -> its method; other types are ignored) and gives `_due` and
    `flush`.
    """

    _HANDLERS: ClassVar[Mapping[type, Callable[[Any, Any], None]]] = {}
    TASK_NAME: ClassVar[str] = "recorder"  # follow()'s task

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db: sqlite3.Connection | None = db
        self._task: asyncio.Task | None = None

    def handle(self, event: object) -> None:
        """Record one hub event (kinds with no handler are ignored); writes only when `_due` says so."""
        handler = self._HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
        if self._due(event):
            self.write()

    @abc.abstractmethod
    def _due(self, event: object) -> bool:
        """Whether a write is due after `event` was handled (a subclass may note the event's time here)."""

    def _due_at_wake(self, wake: int) -> bool:
        """Whether run()'s `wake`-th wake-up writes, for quiet spells: once a second of wake-ups."""
        return wake % WAKES_PER_FLUSH == 0

    @abc.abstractmethod
    def flush(self) -> None:
        """Write every buffered row in one transaction."""

    def write(self) -> bool:
        """flush(); whether it was written (a store whose writes may fail says so here instead of raising)."""
        self.flush()
        return True

    async def run(self, subscription) -> None:
        """Record what `subscription` brings until cancelled, taking what is queued WAKE_SECONDS apart.

        A few wake-ups a second, not one per event: a recorder needs no latency, and each wake-up of a
        task costs the event loop more than recording an event does. Often enough that a log flood
        (20,000 lines/s) stays within the hub's 10,000-event queue between two. Writes at least once
        a second. On cancellation the events still queued (a run's last exits, its end) are recorded.
        """
        try:
            for wake in itertools.count(1):
                await asyncio.sleep(WAKE_SECONDS)
                self._take(subscription)
                if self._due_at_wake(wake):  # handle() writes as events come; this covers quiet spells
                    self.write()
        finally:
            self._take(subscription)
            self.write()

    def _take(self, subscription) -> None:
        for event in subscription.drain(1_000_000):
            self.handle(event)

    def follow(self, hub) -> Self:
        """Subscribe to `hub` (anything with subscribe(): a Cluster, an EventHub) and record in a task
        until stop()."""
        subscription = hub.subscribe()
        self._task = asyncio.create_task(self._follow(subscription), name=self.TASK_NAME)
        return self

    async def _follow(self, subscription) -> None:
        try:
            await self.run(subscription)
        finally:
            subscription.close()

    async def stop(self) -> None:
        """End follow()'s task (what is queued is recorded) and close the file."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.close()

    def close(self) -> None:
        """Write what is buffered, move the write-ahead log into the file and close it (idempotent)."""
        if self._db is None:
            return
        try:
            if self.write():
                self._checkpoint()
        finally:
            self._db.close()
            self._db = None

    def _checkpoint(self) -> None:
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
