"""A store's writes that fail (a full disk), told once, and the first write that succeeds after them.

serve runs for weeks with nobody watching: a write it cannot do must be said, but once, not once a
second; and when space is back, that it writes again, and how long it could not.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

Say = Callable[[str], None]


def say_on_stderr(line: str) -> None:
    print(f"homegpu: {line}", file=sys.stderr, flush=True)


class WriteTrouble:
    """`failed(problem)` after each write that failed, `succeeded()` after each that did; each says only
    what changed: the first failure, then the first success after failures."""

    def __init__(self, say: Say = say_on_stderr, clock: Callable[[], float] = time.time) -> None:
        self.say, self.clock = say, clock
        self.since: float | None = None  # when writes began to fail; None while they succeed
        self.failures = 0  # writes that failed since then

    def failed(self, problem: str, meanwhile: str) -> None:
        """`problem`: the write's one line; `meanwhile`: what happens until a write succeeds."""
        self.failures += 1
        if self.since is None:
            self.since = self.clock()
            self.say(f"{problem}; {meanwhile}")

    def succeeded(self, what: str) -> None:
        """`what` is written again (e.g. "the history /path"), said once after failures."""
        if self.since is not None:
            self.say(f"writing {what} again after {self.clock() - self.since:.0f} s")
            self.since, self.failures = None, 0
