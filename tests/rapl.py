"""A RAPL tree in the kernel's powercap format, for machines that have none (these VMs have no
/sys/class/powercap): a folder per zone with `name`, `energy_uj`, `max_energy_range_uj` and `enabled`, as
Documentation/power/powercap/powercap.rst lays them out (intel-rapl:0 "package-0" with its subzones
intel-rapl:0:0 "core" and intel-rapl:0:2 "dram"; laptops add intel-rapl:1 "psys"). Each zone's counter grows at
the draw it is given and wraps at its range, as the hardware's does."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Iterator

MAX_RANGE_UJ = 262_143_328_850  # max_energy_range_uj of Intel client packages (2^32 units of 61 µJ)
PACKAGE_DRAM = {"intel-rapl:0": ("package-0", 30.0), "intel-rapl:0:0": ("core", 20.0),
                "intel-rapl:0:2": ("dram", 5.0)}  # the core's energy is inside the package's


class RaplTree:
    """Zones {folder: (name, watts)} under `root`, their counters starting at `start_uj` (near the wrap, by
    default, so that a run sees one)."""

    def __init__(self, root: Path, zones: dict[str, tuple[str, float]] = PACKAGE_DRAM,
                 start_uj: int = MAX_RANGE_UJ - 20_000_000, max_range_uj: int = MAX_RANGE_UJ) -> None:
        self.root, self.zones, self.max_range = root, zones, max_range_uj
        self.counters = {folder: start_uj for folder in zones}
        for folder, (name, _) in zones.items():
            zone = root / folder
            zone.mkdir(parents=True, exist_ok=True)
            (zone / "name").write_text(name + "\n")
            (zone / "enabled").write_text("1\n")
            (zone / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
        self._write()

    def advance(self, seconds: float) -> None:
        """Each zone's counter on by its draw × `seconds`, wrapping past its range to 0."""
        for folder, (_, watts) in self.zones.items():
            self.counters[folder] = (self.counters[folder] + round(watts * seconds * 1e6)) % (self.max_range + 1)
        self._write()

    def _write(self) -> None:
        for folder, value in self.counters.items():
            path = self.root / folder / "energy_uj"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"{value}\n")
            tmp.replace(path)  # a reader never sees half a number

    @contextlib.contextmanager
    def running(self, step: float = 0.1) -> Iterator[RaplTree]:
        """The counters advancing with the clock, every `step` s, until the block ends."""
        stop = threading.Event()

        def tick() -> None:
            last = time.monotonic()
            while not stop.wait(step):
                now = time.monotonic()
                self.advance(now - last)
                last = now
        thread = threading.Thread(target=tick, name="rapl", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
