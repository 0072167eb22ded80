"""How many examples of a step a GPU's memory holds, from the most its process held at the share it ran: standard
library only (each framework's reader is in its balance module: `balance_tf.gpu_memory`, `balance_torch.gpu_memory`).

Balancing gives a fast worker a bigger share of each step than the even one it started with, and a fast card with
less memory than a slower one (a 12 GiB RTX 4070 beside a 24 GiB P40) could be given more examples than it holds:
the run would die out of memory. So at each re-split a GPU worker reads the peak its process held since the last
one against the memory it may hold (the job's gpu_memory, else the card's), and its cap, traded with its pace, keeps
its share within it (shares.split). The estimate is conservative: the peak is taken to grow in proportion to the
share (the weights and the optimizer's state do not, so a card holds more than it says), a cap fills at most MARGIN
of the memory, and it is never below the share the worker runs, which fits. As a share grows towards its cap, the
next reading, at the larger share, moves the cap nearer the truth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from homegpu.trainer.gpu_budget import budget

MARGIN = 0.9  # of the memory a process may hold: what a cap fills at most (a framework's own needs vary a little)
_GIB = 1024 ** 3


@dataclass(frozen=True)
class Reading:
    """The most bytes (`peak`) a process held on its GPU at `share` examples a step, of the `usable` it may hold."""

    share: int
    peak: int
    usable: int

    @property
    def cap(self) -> int:
        """The examples a step the GPU holds: the share scaled to MARGIN of the memory, never below the share."""
        return max(self.share, int(self.share * MARGIN * self.usable / self.peak))

    def line(self, holder: str) -> str:
        """'this process's GPU holds about 300 examples of a step (7.2 of 12.0 GiB used at 200): …'"""
        return (f"{holder} holds about {self.cap} examples of a step ({self.peak / _GIB:.1f} of "
                f"{self.usable / _GIB:.1f} GiB used at {self.share}): its share is capped there and the rest goes "
                "to the others")


class GpuMemory:
    """A GPU's memory as its framework reports it, behind two calls that a test can feed (the machines that test
    homegpu have no GPU): `peak()`, the most bytes the process held since the last `reset()`; and `usable`, the
    bytes it may hold."""

    def __init__(self, peak: Callable[[], int], reset: Callable[[], object], usable: int) -> None:
        self.peak, self.reset, self.usable = peak, reset, usable

    def read(self, share: int) -> Reading | None:
        """The peak since the last read, at `share` examples a step, and the count started again; None where the
        process held nothing."""
        peak = int(self.peak())
        self.reset()
        return Reading(share, peak, self.usable) if peak > 0 and share > 0 else None


class CapWatch:
    """When a worker says that its cap holds its share down: as the cap starts to, and again with each new split
    while it does (as the new split is said), not at every re-split."""

    def __init__(self) -> None:
        self.holding = False

    def due(self, holds: bool, moved: bool) -> bool:
        due = holds and (moved or not self.holding)
        self.holding = holds
        return due


def usable(card_total: Callable[[], int | None], env: Mapping[str, str] = os.environ) -> int | None:
    """The bytes a process may hold on its GPU: the job's gpu_memory where it sets one (gpu_budget.py holds the
    framework to it), else the card's total; None where neither is known."""
    return budget(env) or card_total() or None
