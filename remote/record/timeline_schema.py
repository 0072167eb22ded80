"""The timeline file's tables, and the frozen snapshots the reader makes of them.

Kept apart from the recorder so the report reads a timeline without the hub's event types.
Times are Unix seconds; memory in MiB, power in W, clocks in MHz, util and CPU in %.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS node_samples (t REAL, node TEXT, cpu REAL, mem_used REAL, mem_total REAL, load1 REAL,
    host_energy REAL, host_power REAL);
CREATE TABLE IF NOT EXISTS gpu_samples (t REAL, node TEXT, gpu INTEGER, util REAL, mem_used REAL,
    mem_total REAL, temp REAL, power REAL, sm_clock REAL, energy REAL);
CREATE TABLE IF NOT EXISTS worker_samples (t REAL, worker TEXT, event TEXT, epoch REAL, step REAL, loss REAL,
    accuracy REAL, val_loss REAL, val_accuracy REAL, examples_per_sec REAL, steps_per_sec REAL,
    compute_examples_per_sec REAL);
CREATE TABLE IF NOT EXISTS events (t REAL, kind TEXT, node TEXT, worker TEXT, summary TEXT, details TEXT);
CREATE INDEX IF NOT EXISTS node_samples_t ON node_samples (t);
CREATE INDEX IF NOT EXISTS gpu_samples_t ON gpu_samples (t);
CREATE INDEX IF NOT EXISTS worker_samples_t ON worker_samples (t);
"""

Value = float | None


class TimelineDamaged(Exception):
    """timeline.sqlite is there but cannot be read (truncated, overwritten, not SQLite); the message
    names the file and what SQLite said."""


@dataclass(frozen=True)
class Series:
    """One quantity over time: `times[i]` goes with `values[i]` (None where it was not measured)."""

    times: tuple[float, ...] = ()
    values: tuple[Value, ...] = ()

    @property
    def measured(self) -> tuple[float, ...]:
        return tuple(v for v in self.values if v is not None)

    def mean(self) -> float | None:
        values = self.measured
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class GpuTimeline:
    index: int
    util: Series
    mem_used: Series
    mem_total: float | None
    temp: Series
    power: Series
    sm_clock: Series
    energy: Series = Series()  # the GPU's energy counter (J since its driver loaded), where NVML has one


@dataclass(frozen=True)
class NodeTimeline:
    name: str
    cpu: Series
    mem_used: Series
    mem_total: float | None
    gpus: tuple[GpuTimeline, ...]
    host_energy: Series = Series()  # the CPUs' and memory's RAPL counter (J), where the node's user can read it
    host_power: Series = Series()  # else the rest of the machine's draw as idle_watts/busy_watts estimate it


@dataclass(frozen=True)
class WorkerTimeline:
    """A worker's step lines (running loss/accuracy, throughput) and its epoch lines (with val_). Its
    throughput comes from its epoch lines where no step line has one (the PyTorch demo's, a script's)."""

    name: str
    loss: Series
    accuracy: Series
    examples_per_sec: Series
    steps_per_sec: Series
    epoch_loss: Series
    epoch_accuracy: Series
    val_loss: Series
    val_accuracy: Series
    share: Series = Series()  # a balanced run's examples of each step this worker took, as its epoch lines said
    # a balanced run's examples/s of one of its replicas' compute (its passes alone, without its wait for the others)
    compute_examples_per_sec: Series = Series()


@dataclass(frozen=True)
class TimelineEvent:
    at: float
    kind: str
    summary: str
    node: str = ""
    worker: str = ""
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    meta: dict
    start: float | None
    end: float | None
    nodes: tuple[NodeTimeline, ...]
    workers: tuple[WorkerTimeline, ...]
    events: tuple[TimelineEvent, ...]

    @property
    def duration(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0

    def events_of(self, *kinds: str) -> tuple[TimelineEvent, ...]:
        return tuple(event for event in self.events if event.kind in kinds)


# Columns added after the first timelines were written (at the end of their tables): the GPU's energy counter,
# the rest of the machine's RAPL counter and its estimated draw (NodeStats.host_energy, host_power), a balanced
# run's compute speed.
ADDED_COLUMNS = (("gpu_samples", "energy"), ("node_samples", "host_energy"), ("node_samples", "host_power"),
                 ("worker_samples", "compute_examples_per_sec"))


def add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a timeline written by an older homegpu up to today's columns, to append to it."""
    for table, column in ADDED_COLUMNS:
        if column not in _columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} REAL")


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _or_null(db: sqlite3.Connection, table: str, *names: str) -> str:
    """`names` for a SELECT, NULL for each an older timeline does not have."""
    found = _columns(db, table)
    return ", ".join(name if name in found else "NULL" for name in names)


def _series(rows: list[tuple], column: int) -> Series:
    return Series(tuple(row[0] for row in rows), tuple(row[column] for row in rows))


def _grouped(db: sqlite3.Connection, sql: str) -> dict[object, list[tuple]]:
    groups: dict[object, list[tuple]] = defaultdict(list)
    for row in db.execute(sql):
        groups[row[1]].append(row)
    return groups


def _last(values: list[Value]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def _nodes(db: sqlite3.Connection) -> tuple[NodeTimeline, ...]:
    node_rows = _grouped(db, f"SELECT t, node, cpu, mem_used, mem_total, {_or_null(db, 'node_samples', 'host_energy', 'host_power')} "
                             "FROM node_samples ORDER BY node, t")
    gpu_rows: dict[str, list[tuple]] = defaultdict(list)
    for row in db.execute(f"SELECT t, node, gpu, util, mem_used, mem_total, temp, power, sm_clock, "
                          f"{_or_null(db, 'gpu_samples', 'energy')} "
                          "FROM gpu_samples ORDER BY node, gpu, t"):
        gpu_rows[row[1]].append(row)
    nodes = []
    for name in sorted(set(node_rows) | set(gpu_rows)):
        by_gpu: dict[int, list[tuple]] = defaultdict(list)
        for row in gpu_rows.get(name, []):
            by_gpu[row[2]].append(row)
        gpus = tuple(
            GpuTimeline(index, _series(rows, 3), _series(rows, 4), _last([r[5] for r in rows]), _series(rows, 6),
                        _series(rows, 7), _series(rows, 8), _series(rows, 9))
            for index, rows in sorted(by_gpu.items()))
        rows = node_rows.get(name, [])
        nodes.append(NodeTimeline(name, _series(rows, 2), _series(rows, 3), _last([r[4] for r in rows]), gpus,
                                  _series(rows, 5), _series(rows, 6)))
    return tuple(nodes)


def _workers(db: sqlite3.Connection) -> tuple[WorkerTimeline, ...]:
    grouped = _grouped(db, "SELECT t, worker, event, loss, accuracy, val_loss, val_accuracy, examples_per_sec, "
                           f"steps_per_sec, {_or_null(db, 'worker_samples', 'compute_examples_per_sec')} "
                           "FROM worker_samples ORDER BY worker, t")
    workers = []
    for name, rows in sorted(grouped.items()):
        steps = [row for row in rows if row[2] == "step"]
        epochs = [row for row in rows if row[2] == "epoch"]  # `end` repeats the last epoch
        rated = steps if any(row[7] is not None for row in steps) else epochs
        workers.append(WorkerTimeline(
            name, _series(steps, 3), _series(steps, 4), _series(rated, 7), _series(rated, 8),
            _series(epochs, 3), _series(epochs, 4), _series(epochs, 5), _series(epochs, 6),
            compute_examples_per_sec=_series(epochs, 9)))
    return tuple(workers)


def _events(db: sqlite3.Connection) -> tuple[TimelineEvent, ...]:
    return tuple(
        TimelineEvent(t, kind, summary or "", node or "", worker or "", _details(details))
        for t, kind, node, worker, summary, details in db.execute(
            "SELECT t, kind, node, worker, summary, details FROM events ORDER BY t, rowid"))


def _details(text: str | None) -> dict:
    details = json.loads(text or "{}")
    return details if isinstance(details, dict) else {}


def _reader(path: Path) -> sqlite3.Connection:
    """A connection that only reads. Read-write where allowed: a read-only one that closes last
    cannot fold the WAL back, and would leave timeline.sqlite-wal and -shm beside a finished run."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True)
        db.execute("PRAGMA query_only = ON")
        return db
    except sqlite3.OperationalError:  # a run folder we may not write: read it as it is
        return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _meta(db: sqlite3.Connection) -> dict:
    return {key: json.loads(value) for key, value in db.execute("SELECT key, value FROM meta")}


def read_meta(path: Path) -> dict:
    """The file's meta table alone (run id, job, ...): cheap, where a whole Timeline is not needed.

    Raises:
        FileNotFoundError: there is no file at `path`.
        TimelineDamaged: the file cannot be read as a timeline.
    """
    return _read(path, _meta)


def read_timeline(path: Path) -> Timeline:
    """Every row of the file as a :class:`Timeline` (see timeline.load_timeline).

    Raises:
        FileNotFoundError: there is no file at `path`.
        TimelineDamaged: the file cannot be read as a timeline.
    """
    return _read(path, _timeline)


def check_timeline(path: Path) -> None:
    """Whether an existing file is a whole timeline, for a writer about to append to it (SQLite's
    quick_check reads every page once).

    Raises:
        TimelineDamaged: it is not.
    """
    def quick_check(db: sqlite3.Connection) -> None:
        verdict = db.execute("PRAGMA quick_check").fetchone()
        if verdict != ("ok",):
            raise sqlite3.DatabaseError(verdict[0] if verdict else "quick_check said nothing")
        _meta(db)
    _read(path, quick_check)


def _read(path: Path, read):
    if not path.is_file():
        raise FileNotFoundError(f"no timeline at {path}")
    if path.stat().st_size == 0:  # SQLite would take it for a database without tables
        raise TimelineDamaged(f"{path} is damaged (an empty file)")
    try:
        db = _reader(path)
        try:
            return read(db)
        finally:
            db.close()
    except (sqlite3.DatabaseError, ValueError, TypeError) as exc:  # a value that is not JSON: ValueError, TypeError
        raise TimelineDamaged(f"{path} is damaged ({exc})") from None


def _timeline(db: sqlite3.Connection) -> Timeline:
    meta = _meta(db)
    bounds = [db.execute(f"SELECT min(t), max(t) FROM {table}").fetchone()
              for table in ("node_samples", "gpu_samples", "worker_samples", "events")]
    starts = [low for low, _ in bounds if low is not None]
    ends = [high for _, high in bounds if high is not None]
    return Timeline(meta, min(starts) if starts else None, max(ends) if ends else None,
                    _nodes(db), _workers(db), _events(db))
