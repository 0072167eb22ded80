"""serve's sleeper: each node with `sleep_after` goes to sleep once it has been idle that long.

Idle as sleeping.py judges it, CPUs included, and not needed: no queue entry that will run there and no run
that could still restart there (serve's `needed` says which, and why). Each look asks the node (`who`, its
workers), so it comes every CHECK_SECONDS, not with every stats line. A node whose sleep fails is said once
and counted idle again from the next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, Mapping

from homegpu.remote.nodes import Cluster, NodeSession
from homegpu.remote.sleep_wake.sleeping import NotIdle, SleepFailed, idle_problems, put_to_sleep

CHECK_SECONDS = 10.0


class IdleSleeper:
    """Puts idle nodes to sleep after their `sleep_after`; `start()` it, `close()` it."""

    def __init__(self, cluster: Cluster, needed: Callable[[], Mapping[str, str]], say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`needed()`: node -> why work still needs it (a queue entry, a run that may restart)."""
        self.cluster, self.needed, self.say, self.clock = cluster, needed, say, clock
        self.idle_since: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if any(node.spec.sleep_wake.sleep_after for node in self.cluster.nodes.values()):
            self._task = asyncio.create_task(self._loop(), name="idle sleeper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def check(self) -> None:
        """One look at every node with a sleep_after: note the idle ones, put to sleep those idle long enough."""
        needed = self.needed()
        sleepy = [node for node in self.cluster.nodes.values() if node.spec.sleep_wake.sleep_after]
        await asyncio.gather(*(self._look(node, needed.get(node.name)) for node in sleepy))

    async def _loop(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(CHECK_SECONDS)

    async def _look(self, node: NodeSession, needed_for: str | None) -> None:
        busy = [needed_for] if needed_for else await idle_problems(self.cluster, node, cpu=True)
        if busy:  # idle_problems says "it is offline" for a node that is not online
            self.idle_since.pop(node.name, None)
            return
        since = self.idle_since.setdefault(node.name, self.clock())
        idle = self.clock() - since
        if idle < node.spec.sleep_wake.sleep_after:
            return
        self.idle_since.pop(node.name, None)
        try:
            await put_to_sleep(self.cluster, node.name, cpu=True)
        except (NotIdle, SleepFailed) as exc:
            self.say(str(exc))
            return
        spent = f"{idle / 60:.0f} min" if idle >= 120 else f"{idle:.0f} s"
        self.say(f"{node.name} put to sleep after {spent} idle (its sleep_after); work that needs it wakes it")
