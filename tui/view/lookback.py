"""The lookback: the node detail's longer windows (a day, a week) and each node's energy today, read from the
history `homegpu serve` records for this cluster file; the TUI's own trail (gpu_trail.py) covers only the time
it has been open.

Read in a thread (a week of a big cluster takes a fraction of a second) and kept for REREAD_SECONDS.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from homegpu.remote.config import ClusterSpec
from homegpu.remote.history import HistoryError, HistoryReader, history_path

# The node detail's windows after gpu_trail.TRAIL_WINDOWS, where serve records this cluster's history.
LOOKBACK_WINDOWS = (("1 d", 86_400.0), ("7 d", 604_800.0))
REREAD_SECONDS = 60.0
POINTS = 120  # sparkline cells at most: wider than any node detail


@dataclass(frozen=True)
class LookbackSeries:
    """One GPU over a stored window, in percent: utilisation and memory used."""

    util: tuple[float | None, ...]
    mem: tuple[float | None, ...]


class Lookback:
    """This cluster's stored history, if serve records one; `series` holds the last window read."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.path: Path = history_path(spec)
        self.series: dict[tuple[str, int], LookbackSeries] = {}
        self.problem = ""  # why it could not be read (damaged), shown instead of the sparklines
        self._read: tuple[float, float] | None = None  # (window seconds, when)
        self.reading: float | None = None  # the window being read now
        self.today: dict[str, float] = {}  # node -> kWh it used since local midnight (GPUs, and the rest where known)
        self._today_read: float | None = None

    @property
    def available(self) -> bool:
        return self.path.is_file()

    def due(self, seconds: float) -> bool:
        """Whether the window must be read: not read lately, and not being read now."""
        fresh = self._read is not None and self._read[0] == seconds and time.time() - self._read[1] < REREAD_SECONDS
        return not fresh and self.reading != seconds

    async def read(self, seconds: float) -> None:
        """Read the last `seconds` of every GPU (in a thread)."""
        self.reading = seconds
        try:
            self.series = await asyncio.to_thread(_read, self.path, seconds)
            self.problem = ""
        except (HistoryError, OSError) as exc:
            self.series, self.problem = {}, str(exc)
        finally:
            self.reading = None
        self._read = (seconds, time.time())


    def today_due(self) -> bool:
        return self.available and (self._today_read is None or time.time() - self._today_read >= REREAD_SECONDS)

    async def read_today(self) -> None:
        """Read each node's energy since local midnight, its GPUs' and the rest's (in a thread)."""
        self._today_read = time.time()
        try:
            self.today = await asyncio.to_thread(_today, self.path)
        except (HistoryError, OSError):
            self.today = {}  # the window reads say why


def _today(path: Path) -> dict[str, float]:
    now = time.time()
    midnight = time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
    totals: dict[str, float] = {}
    with HistoryReader(path) as reader:
        for part in (*reader.gpu_energy(midnight, now), *reader.host_energy(midnight, now)):
            totals[part.node] = totals.get(part.node, 0.0) + part.energy_kwh
    return totals


def _read(path: Path, seconds: float) -> dict[tuple[str, int], LookbackSeries]:
    now = time.time()
    with HistoryReader(path) as reader:
        gpus = reader.gpus(now - seconds, now, POINTS)
    return {(gpu.node, gpu.gpu): LookbackSeries(gpu.util, tuple(None if m is None or not gpu.mem_total else
                                                                100 * m / gpu.mem_total for m in gpu.mem_used))
            for gpu in gpus}

