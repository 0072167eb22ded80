"""A bandwidth measurement's results, and its event (net/bandwidth.py measures)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkResult:
    """One direction of one link: Gbit/s (10^9 bits per second), or the reason there is none."""

    src: str
    dst: str
    gbits: float | None
    error: str = ""
    at: float = field(default_factory=time.time)

    @property
    def ok(self) -> bool:
        return self.gbits is not None and not self.error


@dataclass(frozen=True)
class BandwidthMatrix:
    """Every measured link, kept with the time the measurement finished."""

    results: tuple[LinkResult, ...]
    at: float = field(default_factory=time.time)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in the order the links first name them."""
        names = [name for result in self.results for name in (result.src, result.dst)]
        return tuple(dict.fromkeys(names))

    @property
    def reachable(self) -> tuple[str, ...]:
        """Nodes with at least one measured link: the workers a job could use now."""
        names = [name for result in self.results if result.ok for name in (result.src, result.dst)]
        return tuple(dict.fromkeys(names))

    @property
    def failed(self) -> tuple[LinkResult, ...]:
        return tuple(result for result in self.results if not result.ok)

    def get(self, src: str, dst: str) -> LinkResult | None:
        """The result for src → dst, or None when that link was not measured (star mode)."""
        return next((r for r in self.results if r.src == src and r.dst == dst), None)

    def slowest(self) -> LinkResult | None:
        """The measured link with the lowest bandwidth; None when no link was measured."""
        measured = [result for result in self.results if result.ok]
        return min(measured, key=lambda result: result.gbits) if measured else None


@dataclass(frozen=True)
class BandwidthMeasured:
    """Published on the cluster's hub when a measurement finishes."""

    matrix: BandwidthMatrix
    at: float = field(default_factory=time.time)
