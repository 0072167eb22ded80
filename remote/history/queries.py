"""What the history answers, as frozen values: each GPU's and node's use over a window in N points (for a
sparkline, `homegpu history`, the TUI, Prometheus), GPU-hours per user and per homegpu run, and each
node's offline intervals with their total.

Pure reads on a connection of their own, beside the running writer (WAL). A window is [since, until)
in Unix seconds. A row counts wholly in the window that holds its time: a raw sample's time, a
bucket's middle, so a window's edges are as sharp as the tier there (1 s, 10 s or 60 s). The N points
cut the window into equal slices by store's one bucket rule, counted from `since` (slice i holds
since + i*w <= t < since + (i+1)*w and stands at its middle); each is the sample-weighted mean of the
rows in it, None where nothing was recorded (a node offline, a slice finer than the tier's buckets).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from homegpu.remote.config import Tariff
from homegpu.remote.energy import JOULES_PER_KWH
from homegpu.remote.history.schema import damaged, has_column, is_damage, open_reader
from homegpu.remote.history.tiers import weighted_mean
from homegpu.remote.store import bucket_time

Value = float | None


@dataclass(frozen=True)
class GpuSeries:
    """One GPU over a window: utilisation in %, memory used in MiB, at `times` (each slice's middle)."""

    node: str
    gpu: int
    name: str
    times: tuple[float, ...]
    util: tuple[Value, ...]
    mem_used: tuple[Value, ...]
    mem_total: float | None  # MiB, the most seen in the window


@dataclass(frozen=True)
class NodeSeries:
    """One node over a window: CPU in %, memory used in MiB."""

    node: str
    times: tuple[float, ...]
    cpu: tuple[Value, ...]
    mem_used: tuple[Value, ...]
    mem_total: float | None


@dataclass(frozen=True)
class UserHours:
    """GPU-hours of one user's processes (homegpu workers included); `user` is "" where the node could not
    tell whose a process was."""

    user: str
    gpu_hours: float


@dataclass(frozen=True)
class RunHours:
    """GPU-hours of one homegpu run's workers."""

    job: str
    run_id: str
    user: str
    gpu_hours: float


@dataclass(frozen=True)
class GpuEnergy:
    """One GPU's energy in a window, in kWh, its cost, and the part of it no process used (idle): `method` is
    how it was obtained ("counter", "integrated" or "mixed"; "" where no energy was recorded)."""

    node: str
    gpu: int
    name: str
    energy_kwh: float
    cost: float
    idle_kwh: float
    idle_cost: float
    method: str


@dataclass(frozen=True)
class HostEnergy:
    """The rest of one machine's energy in a window (CPUs, memory, board: all but its GPUs) and its cost; `method`:
    "rapl" (its RAPL counters), "estimated" (from CPU use and the node's idle_watts/busy_watts) or "mixed"."""

    node: str
    energy_kwh: float
    cost: float
    method: str


@dataclass(frozen=True)
class OwnerEnergy:
    """The energy of one user's GPU processes, or of one homegpu run's workers (`job`, `run_id`), in a window:
    each GPU's energy shared among the owners of its processes as its time is (samples.py)."""

    user: str
    job: str
    run_id: str
    energy_kwh: float
    cost: float


@dataclass(frozen=True)
class OfflineInterval:
    """A node offline from `start` to `stop`; `ongoing` while it still is (then `stop` is the recorder's
    latest mark, at most 10 s old while it runs). `state` and `reason` are the hub's first word of it
    ("offline", "connection lost")."""

    start: float
    stop: float
    state: str
    reason: str
    ongoing: bool


@dataclass(frozen=True)
class NodeOffline:
    """A node's offline intervals that touch the window, and its offline seconds inside the window."""

    node: str
    intervals: tuple[OfflineInterval, ...]
    seconds: float


class HistoryReader:
    """Queries one history file (the writer may be running).

    Args:
        path: the file.
        clock: now, in Unix seconds: the default end of a window.

    Raises:
        FileNotFoundError: there is no file at `path`.
        HistoryDamaged: the file is not a usable history (here or in any query: one line naming it).
    """

    def __init__(self, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.path, self.clock = Path(path), clock
        self._db = open_reader(self.path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "HistoryReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def span(self) -> tuple[float, float] | None:
        """(oldest, newest) sample time kept, or None for a history without samples."""
        def read(db: sqlite3.Connection):
            low, high = db.execute("SELECT min(t), max(t) FROM node_samples").fetchone()
            return None if low is None else (low, high)
        return self._read(read)

    def gpus(self, since: float, until: float | None = None, points: int = 60) -> tuple[GpuSeries, ...]:
        """Every GPU seen in the window, by node and index: utilisation and memory in `points` slices."""
        cell = self._cell(since, until, points)
        names = dict(((node, gpu), name) for node, gpu, name in self._read(
            lambda db: db.execute("SELECT nd.name, g.gpu, g.name FROM gpus g JOIN nodes nd ON nd.id = g.node")))
        rows = self._read(lambda db: _slices(db, "gpu_samples", ("util", "mem_used"), since, cell, points))
        return tuple(GpuSeries(node, gpu, names.get((node, gpu), ""), times, util, mem, total)
                     for (node, gpu), (times, (util, mem), total) in _series(rows, since, cell, points).items())

    def nodes(self, since: float, until: float | None = None, points: int = 60) -> tuple[NodeSeries, ...]:
        """Every node seen in the window: CPU and memory in `points` slices."""
        cell = self._cell(since, until, points)
        rows = self._read(lambda db: _slices(db, "node_samples", ("cpu", "mem_used"), since, cell, points))
        return tuple(NodeSeries(node, times, cpu, mem, total)
                     for (node, _), (times, (cpu, mem), total) in _series(rows, since, cell, points).items())

    def gpu_hours_by_user(self, since: float, until: float | None = None) -> tuple[UserHours, ...]:
        """GPU-hours per user in the window, most first (the rule: samples.py)."""
        hours: dict[str, float] = {}
        for _, user, _, _, ms in self._owner_ms(since, until):
            hours[user] = hours.get(user, 0.0) + ms / 3_600_000
        return tuple(UserHours(user, h) for user, h in sorted(hours.items(), key=lambda item: (-item[1], item[0])))

    def gpu_hours_by_run(self, since: float, until: float | None = None) -> tuple[RunHours, ...]:
        """GPU-hours per homegpu run (its workers' processes) in the window, most first."""
        hours: dict[tuple[str, str, str], float] = {}
        for kind, user, job, run_id, ms in self._owner_ms(since, until):
            if kind == "worker":
                hours[(job, run_id, user)] = hours.get((job, run_id, user), 0.0) + ms / 3_600_000
        return tuple(RunHours(job, run_id, user, h)
                     for (job, run_id, user), h in sorted(hours.items(), key=lambda item: (-item[1], item[0])))

    def gpu_energy(self, since: float, until: float | None = None, tariff: Tariff = Tariff()) -> tuple[GpuEnergy, ...]:
        """Every GPU's energy in the window, by node and index, priced by `tariff` (no price: cost 0)."""
        until = self._until(since, until)
        names = dict(((node, gpu), name) for node, gpu, name in self._read(
            lambda db: db.execute("SELECT nd.name, g.gpu, g.name FROM gpus g JOIN nodes nd ON nd.id = g.node")))
        if not self._read(lambda db: has_column(db, "gpu_samples", "energy_mj")):
            return ()  # a history no homegpu with energy has written to yet
        totals: dict[tuple[str, int], list[float]] = {}  # joules, cost, owned joules, owned cost, rows, counted
        for node, gpu, minute, millijoules, rows, counted in self._energy_rows(
                "SELECT nd.name, s.gpu, {minute}, sum(s.energy_mj), sum(s.n), sum(s.counted) FROM gpu_samples s "
                "JOIN nodes nd ON nd.id = s.node WHERE s.t >= ? AND s.t < ? AND s.energy_mj IS NOT NULL "
                "GROUP BY s.node, s.gpu, 3", since, until, tariff):
            found = totals.setdefault((node, gpu), [0.0] * 6)
            found[0] += millijoules / 1000
            found[1] += _cost(millijoules, minute, tariff)
            found[4] += rows
            found[5] += counted or 0
        for node, gpu, minute, millijoules in self._energy_rows(
                "SELECT nd.name, s.gpu, {minute}, sum(s.energy_mj) FROM owner_samples s "
                "JOIN nodes nd ON nd.id = s.node WHERE s.t >= ? AND s.t < ? AND s.energy_mj IS NOT NULL "
                "GROUP BY s.node, s.gpu, 3", since, until, tariff):
            if (node, gpu) in totals:
                totals[(node, gpu)][2] += millijoules / 1000
                totals[(node, gpu)][3] += _cost(millijoules, minute, tariff)
        return tuple(GpuEnergy(node, gpu, names.get((node, gpu), ""), joules / JOULES_PER_KWH, cost,
                               max(joules - owned, 0.0) / JOULES_PER_KWH, max(cost - owned_cost, 0.0),
                               _method(rows, counted))
                     for (node, gpu), (joules, cost, owned, owned_cost, rows, counted) in sorted(totals.items()))

    def host_energy(self, since: float, until: float | None = None, tariff: Tariff = Tariff()) -> tuple[HostEnergy, ...]:
        """The rest of each machine's energy in the window (nodes whose RAPL or idle_watts gave one), by node."""
        until = self._until(since, until)
        if not self._read(lambda db: has_column(db, "node_samples", "host_mj")):
            return ()
        totals: dict[str, list[float]] = {}  # joules, cost, samples, counted
        for node, minute, millijoules, samples, counted in self._energy_rows(
                "SELECT nd.name, {minute}, sum(s.host_mj), sum(s.n), sum(s.host_counted) FROM node_samples s "
                "JOIN nodes nd ON nd.id = s.node WHERE s.t >= ? AND s.t < ? AND s.host_mj IS NOT NULL "
                "GROUP BY s.node, 2", since, until, tariff):
            found = totals.setdefault(node, [0.0] * 4)
            found[0] += millijoules / 1000
            found[1] += _cost(millijoules, minute, tariff)
            found[2] += samples
            found[3] += counted or 0
        return tuple(HostEnergy(node, joules / JOULES_PER_KWH, cost, _HOST_METHODS[_method(samples, counted)])
                     for node, (joules, cost, samples, counted) in sorted(totals.items()))

    def owner_energy(self, since: float, until: float | None = None,
                     tariff: Tariff = Tariff()) -> tuple[OwnerEnergy, ...]:
        """Energy per owner of GPU processes in the window (a user's own processes with job and run_id "", a
        run's workers with theirs), most first."""
        until = self._until(since, until)
        if not self._read(lambda db: has_column(db, "owner_samples", "energy_mj")):
            return ()
        totals: dict[tuple[str, str, str], list[float]] = {}
        for user, job, run_id, minute, millijoules in self._energy_rows(
                "SELECT o.user, o.job, o.run_id, {minute}, sum(s.energy_mj) FROM owner_samples s "
                "JOIN owners o ON o.id = s.owner WHERE s.t >= ? AND s.t < ? AND s.energy_mj IS NOT NULL "
                "GROUP BY s.owner, 4", since, until, tariff):
            found = totals.setdefault((user, job, run_id), [0.0, 0.0])
            found[0] += millijoules / 1000
            found[1] += _cost(millijoules, minute, tariff)
        return tuple(OwnerEnergy(user, job, run_id, joules / JOULES_PER_KWH, cost)
                     for (user, job, run_id), (joules, cost) in sorted(totals.items(), key=lambda i: (-i[1][0], i[0])))

    def _energy_rows(self, sql: str, since: float, until: float, tariff: Tariff) -> list[tuple]:
        """`sql`'s rows, its `{minute}` the local minute of the day of each row where the tariff's price depends
        on it (so SQLite sums each GPU's energy per minute of the day, not per row), else 0."""
        minute = _LOCAL_MINUTE if tariff.periods else "0"
        return self._read(lambda db: db.execute(sql.format(minute=minute), (since, until)))

    def offline(self, since: float, until: float | None = None) -> tuple[NodeOffline, ...]:
        """Every node the history knows, by name, with its offline intervals in the window and their total
        seconds inside it (0 for a node never offline there)."""
        until = self._until(since, until)

        def read(db: sqlite3.Connection):
            nodes = [name for (name,) in db.execute("SELECT name FROM nodes ORDER BY name")]
            last = db.execute("SELECT max(stop) FROM sessions").fetchone()[0]
            rows = db.execute(
                "SELECT nd.name, d.state, d.reason, d.start, coalesce(d.stop, ?), d.stop IS NULL FROM node_down d "
                "JOIN nodes nd ON nd.id = d.node WHERE d.start < ? AND coalesce(d.stop, ?) > ? ORDER BY d.start",
                (last, until, last, since)).fetchall()
            return nodes, rows
        nodes, rows = self._read(read)
        intervals: dict[str, list[OfflineInterval]] = {node: [] for node in nodes}
        for node, state, reason, start, stop, ongoing in rows:
            intervals[node].append(OfflineInterval(start, max(start, stop), state, reason, bool(ongoing)))
        return tuple(NodeOffline(node, tuple(found), sum(max(0.0, min(i.stop, until) - max(i.start, since))
                                                         for i in found))
                     for node, found in intervals.items())

    # -- helpers ----------------------------------------------------------------------------------

    def _until(self, since: float, until: float | None) -> float:
        until = self.clock() if until is None else until
        if not until > since:
            raise ValueError(f"an empty window: since {since} is not before until {until}")
        return until

    def _cell(self, since: float, until: float | None, points: int) -> float:
        """The seconds each of `points` slices of the window spans."""
        if points < 1:
            raise ValueError(f"points must be at least 1, not {points}")
        return (self._until(since, until) - since) / points

    def _owner_ms(self, since: float, until: float | None) -> list[tuple]:
        until = self._until(since, until)
        return self._read(lambda db: db.execute(
            "SELECT o.kind, o.user, o.job, o.run_id, sum(s.gpu_ms) FROM owner_samples s "
            "JOIN owners o ON o.id = s.owner WHERE s.t >= ? AND s.t < ? GROUP BY s.owner", (since, until)).fetchall())

    def _read(self, read):
        try:
            result = read(self._db)
            return result.fetchall() if isinstance(result, sqlite3.Cursor) else result
        except sqlite3.DatabaseError as exc:
            if not is_damage(exc):
                raise
            raise damaged(self.path, str(exc)) from None


# The local minute of the day of a row's time (SQLite's localtime: the controller's zone, summer time too).
_LOCAL_MINUTE = ("CAST(strftime('%H', s.t, 'unixepoch', 'localtime') AS INTEGER) * 60 "
                 "+ CAST(strftime('%M', s.t, 'unixepoch', 'localtime') AS INTEGER)")


def _cost(millijoules: float, minute: int, tariff: Tariff) -> float:
    """What `millijoules` used at `minute` of the day cost under `tariff` (0 without a price)."""
    return millijoules / 1000 / JOULES_PER_KWH * tariff.price_of_minute(minute) if tariff.priced else 0.0


def _method(samples: float, counted: float) -> str:
    """How a GPU's energy over some samples was obtained: by its counter in all of them, in none, or in some
    (tiers.py keeps `counted` comparable with `n`)."""
    return "counter" if counted >= samples else "integrated" if not counted else "mixed"


_HOST_METHODS = {"counter": "rapl", "integrated": "estimated", "mixed": "mixed"}


def _slices(db: sqlite3.Connection, table: str, columns: tuple[str, ...], since: float, cell: float,
            points: int) -> list[tuple]:
    """(node, gpu (0 for a node's rows), slice number, the columns' means..., max mem_total) per slice with
    rows. A query per slice: each groups a few thousand rows, where one query over a month would sort
    millions (twice as slow, measured)."""
    means = ", ".join(weighted_mean(column) for column in columns)
    by_gpu = ", gpu" if table == "gpu_samples" else ""
    query = f"SELECT node{by_gpu}, {means}, max(mem_total) FROM {table} WHERE t >= ? AND t < ? GROUP BY node{by_gpu}"
    names = dict(db.execute("SELECT id, name FROM nodes"))
    found = []
    for index in range(points):  # slice i: since + i*cell <= t < since + (i+1)*cell, the bucket rule from `since`
        for node, *values in db.execute(query, (since + index * cell, since + (index + 1) * cell)):
            if not by_gpu:
                values = [0, *values]
            found.append((names.get(node, f"node {node}"), values[0], index, *values[1:]))
    return found


def _series(rows: list[tuple], since: float, cell: float, points: int) -> dict[tuple[str, int], tuple]:
    """Rows of _slices as, per (node, gpu) in order: (times, (one tuple of `points` values per column),
    mem_total)."""
    found: dict[tuple[str, int], tuple[list[list[Value]], list[float]]] = {}
    for node, gpu, index, *values, total in rows:
        columns, totals = found.setdefault((node, gpu), ([[None] * points for _ in values], []))
        for column, value in zip(columns, values):
            column[index] = value
        if total is not None:
            totals.append(total)
    times = tuple(since + bucket_time(i, cell) for i in range(points))
    return {key: (times, tuple(tuple(column) for column in columns), max(totals) if totals else None)
            for key, (columns, totals) in sorted(found.items())}
