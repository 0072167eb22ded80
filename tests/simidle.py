"""A simulated node's own CPUs, idle: its /proc/stat, as a machine of its own would show it.

The simulated nodes share this machine's two cores with everything else the suite runs, so the /proc/stat a
node's agent reads is the whole suite's: under six xdist workers it is more than half busy, and serve never
finds an idle node idle enough to sleep (sleep_wake/sleeping.py BUSY_CPU_PERCENT). A node made with
`SimNode(idle_cpus=True)` sees instead, at /proc/stat in its mount namespace, a file in the kernel's format
whose aggregate `cpu` line gains idle time only, as the CPUs of an idle machine of its own would: a fake for
hardware this machine lacks (a second machine's CPUs), written in proc(5)'s documented format.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

CPUS = 2
USER_HZ = 100  # the kernel's jiffies per second in /proc/stat (USER_HZ)
TICK_S = 0.5
WIDTH = 14  # every number this wide, so that each write replaces the last byte for byte (no reader sees a tail)

_files: set[Path] = set()
_lock = threading.Lock()
_ticker: threading.Thread | None = None


def stat_text(seconds: float) -> str:
    """/proc/stat of CPUS idle CPUs `seconds` after boot: user nice system idle iowait irq softirq steal guest
    guest_nice, then a line per CPU, then the counters the agent does not read."""
    busy = 1000  # a machine's boot leaves some
    idle = int(seconds * USER_HZ)

    def line(name: str, cpus: int) -> str:
        fields = [busy * cpus, 0, busy * cpus, idle * cpus, 0, 0, 0, 0, 0, 0]
        return f"{name:<5}" + " ".join(f"{value:>{WIDTH}}" for value in fields) + "\n"

    return line("cpu", CPUS) + "".join(line(f"cpu{i}", 1) for i in range(CPUS)) + f"processes {1000:>{WIDTH}}\n"


def keep_idle(path: Path) -> None:
    """Write `path` now and keep it counting idle time until forget(path)."""
    global _ticker
    _write(path)
    with _lock:
        _files.add(path)
        if _ticker is None:
            _ticker = threading.Thread(target=_tick, name="idle cpus", daemon=True)
            _ticker.start()


def forget(path: Path) -> None:
    with _lock:
        _files.discard(path)


def _write(path: Path) -> None:
    text = stat_text(time.monotonic()).encode()
    with open(path, "r+b" if path.exists() else "wb") as file:  # in place: the bind mount holds this inode
        file.write(text)


def _tick() -> None:
    while True:
        time.sleep(TICK_S)
        with _lock:
            paths = list(_files)
        for path in paths:
            try:
                _write(path)
            except OSError:  # its node's folder is gone
                forget(path)
