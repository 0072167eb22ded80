"""The GPU trail: what the TUI saw of each GPU's utilisation and memory since it opened, over hours, bounded.

Every sample goes into three tiers at once, each averaging it into buckets of its own size
(remote/store/buckets.py's rule, the one the run's timeline uses too) and keeping a fixed number of
them: 1 s buckets for the last 10 minutes, 10 s for the last 2 hours, 60 s for the last 24 hours.
A window is drawn from the finest tier that covers it. Values are whole percents, so the slots hold
Python's shared small ints (and None for a gap): at most 2,760 slots, about 22 KB, per series,
two series per GPU, however long the TUI stays open. Pure: no Textual, no I/O.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from homegpu.remote.store import bucket_index, bucket_time

# (bucket seconds, buckets kept): 10 min at 1 s, 2 h at 10 s, 24 h at 60 s.
TIERS = ((1.0, 600), (10.0, 720), (60.0, 1440))
SLOTS_PER_SERIES = sum(keep for _, keep in TIERS)

# The node detail's windows, cycled with a key: (label, seconds; None is all there is). After them come
# lookback.LOOKBACK_WINDOWS, read from serve's history.
TRAIL_WINDOWS = (("5 min", 300.0), ("1 h", 3600.0), ("all", None))


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class Tier:
    """Bucket means of one size, the newest `keep` of them (gaps, such as a node offline, are None)."""

    __slots__ = ("size", "values", "newest", "open", "total", "count")

    def __init__(self, size: float, keep: int) -> None:
        self.size = size
        self.values: collections.deque[int | None] = collections.deque(maxlen=keep)
        self.newest: int | None = None  # index of the last closed bucket (the right end of `values`)
        self.open: int | None = None  # index of the bucket being filled
        self.total, self.count = 0.0, 0

    def add(self, t: float, value: float | None) -> None:
        index = bucket_index(t, self.size)
        if self.open is not None and index < self.open:
            return  # older than the bucket being filled (the node's clock stepped back): dropped
        if self.open is not None and index > self.open:
            self._close()
        self.open = index
        if value is not None:
            self.total += value
            self.count += 1

    def _close(self) -> None:
        if self.newest is not None:
            for _ in range(min(self.open - self.newest - 1, self.values.maxlen)):
                self.values.append(None)
        self.values.append(round(self.total / self.count) if self.count else None)
        self.newest, self.total, self.count = self.open, 0.0, 0

    def points(self) -> list[tuple[float, float | None]]:
        """(bucket time, mean) of every bucket kept, oldest first, the one being filled last."""
        if self.open is None:
            return []
        points = []
        if self.newest is not None:
            first = self.newest - len(self.values) + 1
            points = [(bucket_time(first + i, self.size), v) for i, v in enumerate(self.values)]
        points.append((bucket_time(self.open, self.size), round(self.total / self.count) if self.count else None))
        return points

    @property
    def span(self) -> float:
        """Seconds this tier reaches back from its newest bucket."""
        return self.size * (self.values.maxlen or 0)


@dataclass
class Series:
    """One measure (a GPU's util %, say) in every tier, from its first sample on."""

    tiers: tuple[Tier, ...] = field(default_factory=lambda: tuple(Tier(size, keep) for size, keep in TIERS))
    first: float | None = None
    last: float | None = None

    def add(self, t: float, value: object) -> None:
        number = _number(value)
        for tier in self.tiers:
            tier.add(t, number)
        self.first = t if self.first is None else min(self.first, t)
        self.last = t if self.last is None else max(self.last, t)

    def window(self, seconds: float | None, width: int) -> list[float | None]:
        """The last `seconds` (None: everything kept) as at most `width` cell means, oldest first.

        Each cell covers the same time, never less than the tier's bucket, so a history shorter
        than the window leaves the left of the plot empty (the newest value stays at the right edge).
        """
        if width <= 0 or self.last is None:
            return []
        span = seconds if seconds is not None else self.last - self.first + self.tiers[0].size  # through the last
        tier = next((t for t in self.tiers if t.span >= span), self.tiers[-1])
        span = min(span, tier.span)
        cell = max(span / width, tier.size)
        cells = max(1, min(width, math.ceil(span / cell)))
        end = bucket_time(bucket_index(self.last, tier.size), tier.size) + tier.size / 2  # the open bucket's end
        start = end - cells * cell
        totals, counts = [0.0] * cells, [0] * cells
        for t, value in tier.points():
            column = math.floor((t - start) / cell)
            if value is not None and 0 <= column < cells:
                totals[column] += value
                counts[column] += 1
        return [totals[i] / counts[i] if counts[i] else None for i in range(cells)]


@dataclass
class GpuTrail:
    """A GPU's utilisation and memory use, in percent."""

    util: Series = field(default_factory=Series)
    mem: Series = field(default_factory=Series)

    def add(self, t: float, util: object, mem_percent: object) -> None:
        self.util.add(t, util)
        self.mem.add(t, mem_percent)
