"""The runs a controller on this machine records now under experiments/, and each worker's latest epoch line, read
as metrics.jsonl grows: what `homegpu status` shows beside a `homegpu run` started in the same folder.

A controller holds a shared flock on the metrics.jsonl it appends to (ExperimentLog) for as long as it records the
run; the kernel lets go of it however the controller ends (the run done, detached, killed). So a run is live while
its file is locked, and one that ended is not. A file found unlocked is looked at again every RECHECK_SECONDS,
opened only when it changed (a controller that takes the run up writes to it). A live one is read once from its
end, back only as far as its workers' latest epoch lines, then only what was appended since: a long run costs a
read of its new lines each time, never its whole file again.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from homegpu.remote.events import Metric
from homegpu.remote.record.run_folder import METRICS_NAME

FIRST_READ = 64 * 1024  # bytes of a file's end read first (a few hundred lines); four times more each time short
EPOCH_MARK = b'"epoch"'  # in every epoch line (and some others): only such lines are parsed
HOLD_TRIES = 50  # 2 ms apart
RECHECK_SECONDS = 10.0  # how often the runs found unrecorded are looked at again (a controller may take one up)


def hold_recording(handle: IO) -> None:
    """Mark a run's metrics.jsonl as recorded now by this process, until `handle` is closed. A status asking at that
    moment holds the file for two system calls: waited for, but never for long (one stopped there, Ctrl-Z, would
    make the run go unshown, never stall it)."""
    for _ in range(HOLD_TRIES):
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.002)


def recorded_now(handle: IO) -> bool:
    """Whether a controller holds the file `handle` is open on (hold_recording), asked without waiting."""
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return False


@dataclass(frozen=True)
class LiveRun:
    """A run recorded now: each worker's latest epoch line (by its rank, else its label), none before the first."""

    run_id: str
    epochs: tuple[tuple[str, Metric], ...]  # (worker label, its latest epoch line)


class _Reader:
    """One live run's metrics.jsonl: its workers' latest epoch lines, and how far the file was read."""

    def __init__(self) -> None:
        self.offset = 0
        self.latest: dict[str, Metric] = {}

    def read(self, handle: IO[bytes]) -> None:
        size = os.fstat(handle.fileno()).st_size
        if size < self.offset:  # made anew: read it again
            self.offset, self.latest = 0, {}
        if self.offset == 0:
            self._first(handle, size)
        elif size > self.offset:
            self._take(handle, self.offset, size)

    def _first(self, handle: IO[bytes], size: int) -> None:
        """From the file's end, back until every worker's latest epoch line is in (or the start reached)."""
        block = FIRST_READ
        while True:
            start = max(0, size - block)
            self.latest = {}
            self._take(handle, start, size, cut=start > 0)
            if start == 0 or self._complete():
                return
            block *= 4

    def _take(self, handle: IO[bytes], start: int, end: int, cut: bool = False) -> None:
        """The whole lines from `start` to `end`: `cut`, the first may be a line's end, and is left out; a last one
        not yet ended is read once it is."""
        handle.seek(start)
        data = handle.read(end - start)
        lines = data.split(b"\n")
        unended = lines.pop()
        self.offset = start + len(data) - len(unended)
        for line in lines[1:] if cut else lines:
            if EPOCH_MARK in line:
                self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            fields = json.loads(line)
        except ValueError:
            return
        if isinstance(fields, dict) and fields.get("event") == "epoch":
            self.latest[str(fields.get("worker_label", ""))] = Metric(fields)

    def _complete(self) -> bool:
        """Whether the lines read hold an epoch line of every rank the newest says there are."""
        metrics = list(self.latest.values())
        workers = max((metric.workers or 0 for metric in metrics), default=0)
        return bool(workers) and {metric.rank for metric in metrics} >= set(range(workers))

    def run(self, run_id: str) -> LiveRun:
        order = sorted(self.latest.items(), key=lambda item: (item[1].rank is None, item[1].rank or 0, item[0]))
        return LiveRun(run_id, tuple(order))


class LiveRuns:
    """The runs under `experiments` that a controller records now, read each time `read` is called."""

    def __init__(self, experiments: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.experiments, self.clock = Path(experiments), clock
        self._readers: dict[str, _Reader] = {}
        self._quiet: dict[str, tuple[int, int]] = {}  # a run not recorded now -> its file's (mtime, size) then
        self._listed: tuple[int, list[str]] = (-1, [])  # the folder's mtime, and its runs then
        self._recheck_at = 0.0  # when the quiet runs are looked at again, by `clock`

    def read(self) -> list[LiveRun]:
        """Every live run, in run id order, with what its workers told since the last call."""
        recheck = self.clock() >= self._recheck_at
        if recheck:
            self._recheck_at = self.clock() + RECHECK_SECONDS
        runs = []
        for name in self._names(recheck):
            if name in self._quiet and not recheck:
                continue
            if (run := self._live(name)) is not None:
                runs.append(run)
        return runs

    def _live(self, name: str) -> LiveRun | None:
        """The run `name` if a controller records it now, read on from where the last look ended."""
        metrics = os.path.join(self.experiments, name, METRICS_NAME)  # str, not Path: a stat a run, each time
        try:
            seen = os.stat(metrics)
            if self._quiet.get(name) == (seen.st_mtime_ns, seen.st_size):
                return None  # as it was when no one recorded it: a controller that takes it up writes soon
            with open(metrics, "rb") as handle:
                if not recorded_now(handle):
                    self._quiet[name] = (seen.st_mtime_ns, seen.st_size)
                    self._readers.pop(name, None)
                    return None
                self._quiet.pop(name, None)
                reader = self._readers.setdefault(name, _Reader())
                reader.read(handle)
        except OSError:  # no metrics (yet), or gone since it was listed
            return None
        return reader.run(name)

    def _names(self, again: bool) -> list[str]:
        """The run folders, listed again when the folder changed (a run begun), or `again` (its mtime's grain is
        coarse: a folder made in the same tick as the last listing is found by the next recheck)."""
        try:
            stamp = os.stat(self.experiments).st_mtime_ns
            if again or stamp != self._listed[0]:
                self._listed = (stamp, sorted(entry.name for entry in os.scandir(self.experiments) if entry.is_dir()))
        except OSError:  # no experiments folder here: no run recorded here
            return []
        return self._listed[1]
