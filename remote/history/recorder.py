"""The cluster's history, recorded: one more subscriber of the event hub, writing one SQLite file.

`HistoryRecorder.handle(event)` only appends rows to a buffer (a `SampleRecorder`, store/); the buffer is
written in one transaction once a second by the clock, then the tiers are compacted once a minute and the
size bound kept. The clock is injected: with one that follows simulated time, a test or a benchmark writes a
month of history with this code in seconds.

Recorded: every node's CPU and memory and every GPU's utilisation, memory, temperature and power
(tiers.py); each GPU process's owner and the GPU time it was given (samples.py has the rule); the
intervals a node was offline, and the sessions the recorder ran (a node is offline from the hub's
first word that it is not online, after it was online or failed to connect, until it is online again;
the connecting a session starts with is not offline). Time when nothing was recording is neither.

A write that fails (a full disk) never stops the recorder: it is said once through `say`, the samples
that could not be written are dropped (the history shows that span as a gap, not as data, and no GPU
time is credited across it), and each later write tries again; the first that succeeds says so.
"""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Callable

from homegpu.remote.energy import COUNTER, EnergySteps, Step
from homegpu.remote.events import NodeState, NodeStateChanged, NodeStatsUpdated
from homegpu.remote.history.bound import DEFAULT_MAX_BYTES, SizeBound
from homegpu.remote.history.samples import OwnerKey, owner_shares, whole
from homegpu.remote.history.schema import (
    HOST, HistoryError, cannot_write, open_writer, read_energy_totals, write_energy_totals,
)
from homegpu.remote.history.tiers import INSERT, Compactor
from homegpu.remote.store import FLUSH_SECONDS, SampleRecorder, Say, WriteTrouble, say_on_stderr, transaction

COMPACT_EVERY_SECONDS = 60.0
MAX_GAP_SECONDS = 10.0  # a sample stands for at most this much GPU time (the node's agent stalled)
MARK_SECONDS = 10.0  # how often the session's end is moved on: where a killed recorder's intervals end

Clock = Callable[[], float]


class HistoryRecorder(SampleRecorder):
    """Writes the history file; one instance is its only writer.

    Args:
        path: the SQLite file (created with its folder; an existing one is checked and added to).
        max_bytes: the size bound of the file and its WAL together (bound.py); at least 1 MiB.
        clock: now, in Unix seconds: when to write, compact and drop. Samples keep their events' times.
        max_gap: the most GPU time one sample stands for; give 3 × the cluster's stats_interval where
            that is longer than 10 s.
        say: where a write that failed, and the first one that succeeds after it, are told (one line each).

    Raises:
        HistoryDamaged: the file is not a whole history (one line naming it and what to do).
        HistoryError: it cannot be created or written (a read-only folder): one line too.
        ValueError: `max_bytes` is too small.
    """

    TASK_NAME = "history"

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES, clock: Clock = time.time,
                 max_gap: float = MAX_GAP_SECONDS, say: Say = say_on_stderr) -> None:
        self.path, self.clock, self.max_gap = Path(path), clock, max_gap
        self.trouble = WriteTrouble(say, clock)
        super().__init__(open_writer(self.path))
        try:
            self.bound = SizeBound(self._db, self.path, max_bytes)
            self.compactor = Compactor(self._db)
            self._nodes = dict(self._db.execute("SELECT name, id FROM nodes"))
            self._owners = {OwnerKey(*key): id_ for id_, *key in self._db.execute(
                "SELECT id, kind, user, job, run_id, container FROM owners")}
            self._gpus = {(node, gpu): (name, uuid) for node, gpu, name, uuid in self._db.execute(
                "SELECT node, gpu, name, uuid FROM gpus")}
            self._energy = read_energy_totals(self._db)  # (node, gpu) -> joules ever recorded: /metrics counters
            self._energy_written = dict(self._energy)
            self._session = self._start_session()
            self.bound.keep()  # a bound lowered since the file was last written takes hold at once
        except BaseException:
            self._db.close()
            raise
        self._node_rows: list[tuple] = []
        self._gpu_rows: list[tuple] = []
        self._owner_rows: list[tuple] = []
        self._rows = {"node_samples": self._node_rows, "gpu_samples": self._gpu_rows,
                      "owner_samples": self._owner_rows}
        self._new: list[tuple[str, tuple]] = []  # nodes, owners, GPU names, state changes: in event order
        self._last_sample: dict[int, float] = {}  # node -> its previous sample's time, while online
        self._steps = EnergySteps(max_gap)  # each GPU's energy since its previous sample, keyed (node, GPU)
        self._down: set[int] = set()  # nodes with an offline interval open
        self._seen: set[int] = set()  # nodes with a state in this session
        self._last_flush = self._last_compact = self._marked = self.clock()

    # -- recording ----------------------------------------------------------------------------

    def _due(self, event: object = None) -> bool:
        """A second of the clock since the last write, or the clock was set back."""
        return not 0 <= self.clock() - self._last_flush < FLUSH_SECONDS

    def _due_at_wake(self, wake: int) -> bool:
        """The clock decides in quiet spells too: a write once a second of it."""
        return self._due()

    def write(self) -> bool:
        """flush(), and a failure said (once) instead of raised: its samples are dropped and the next write
        tries again. Whether it was written."""
        try:
            self.flush()
        except HistoryError as exc:
            for rows in self._rows.values():
                rows.clear()  # a gap: nodes, owners and state changes (self._new) stay for the next write
            self._last_sample.clear()  # no GPU time across the gap
            self._steps.forget()  # and no energy
            self._energy = dict(self._energy_written)  # the counters count what the history holds
            self.trouble.failed(str(exc), "its samples are not recorded (a gap in the history) until it can "
                                          "write again, which it tries each second")
            return False
        self.trouble.succeeded(f"the history {self.path}")
        return True

    def flush(self) -> None:
        """Write what is buffered in one transaction; then, when due, compact, and keep the bound.

        Raises:
            HistoryError: the file could not be written (a full disk, say); one line naming it.
        """
        now = self._last_flush = self.clock()
        try:
            with transaction(self._db):
                for op, values in self._new:
                    self._db.execute(_NEW[op], values)
                for table, rows in self._rows.items():
                    if rows:
                        self._db.executemany(INSERT[table], rows)
                changed = {key: joules for key, joules in self._energy.items()
                           if self._energy_written.get(key) != joules}
                write_energy_totals(self._db, changed)
                if self._new or not 0 <= now - self._marked < MARK_SECONDS:
                    self._marked = now
                    self._db.execute("UPDATE sessions SET stop = ? WHERE rowid = ?", (now, self._session))
        except sqlite3.OperationalError as exc:  # rolled back: what was buffered stays for the next try
            raise cannot_write(self.path, exc) from None
        self._new.clear()
        self._energy_written.update(changed)
        for rows in self._rows.values():
            rows.clear()
        try:
            if not 0 <= now - self._last_compact < COMPACT_EVERY_SECONDS:
                self._last_compact = now
                self.compactor.run(now)
            self.bound.keep()
        except sqlite3.OperationalError as exc:
            raise cannot_write(self.path, exc) from None

    def close(self) -> None:
        """Write what is buffered, end the open offline intervals and the session now, close (idempotent)."""
        if self._db is not None:
            now = self.clock()
            for node in sorted(self._down):
                self._new.append(("close_down", (now, node)))
            self._down.clear()
            self._marked = -math.inf  # the session ends now
        super().close()

    def _checkpoint(self) -> None:
        try:
            super()._checkpoint()
        except sqlite3.OperationalError as exc:  # on a disk that filled since
            self.trouble.failed(str(cannot_write(self.path, exc)), "what it holds is in its write-ahead log")

    # -- per event kind ---------------------------------------------------------------------------

    def _stats(self, event: NodeStatsUpdated) -> None:
        """A node row, a row per GPU, a row per owner of a GPU's processes (the one path run per sample:
        kept free of calls that are not needed)."""
        at = event.at
        if at < self.compactor.full_rate_since:
            return  # over an hour late: its time is already bucketed
        node = self._nodes.get(event.node) or self._node(event.node)
        stats, t = event.stats, round(at, 3)
        previous = self._last_sample.get(node)
        self._last_sample[node] = at
        credit_ms = 1000 * min(at - previous, self.max_gap) if previous is not None and at > previous else 0.0
        host = self._steps.step((node, HOST), at, stats.host_power, stats.host_energy)
        self._node_rows.append((t, node, 1, whole(stats.cpu), whole(stats.mem_used), whole(stats.mem_total),
                                *self._count((node, HOST), host)))
        gpu_rows = self._gpu_rows
        for position, gpu in enumerate(stats.gpus):
            index = gpu.index if type(gpu.index) is int else position
            step = self._steps.step((node, index), at, gpu.power, gpu.energy)
            joules = None if step is None else step.joules
            gpu_rows.append((t, node, index, 1, whole(gpu.util), whole(gpu.mem_used), whole(gpu.mem_total),
                             whole(gpu.temp), whole(gpu.power), *self._count((node, index), step)))
            names = self._gpus.get((node, index))
            if names is None or names[0] != gpu.name or names[1] != gpu.uuid:
                self._gpu_name(node, index, gpu)
            if gpu.processes:
                for owner, share, mem in owner_shares(gpu.processes):
                    owner_id = self._owners.get(owner) or self._owner(owner)
                    self._owner_rows.append((t, node, index, owner_id, 1, round(credit_ms * share), mem,
                                             None if joules is None else round(joules * 1000 * share)))

    def _count(self, key: tuple[int, int], step: Step | None) -> tuple[int | None, int | None]:
        """Add a GPU's (or, under HOST, the rest of a machine's) step to its total; its row's energy in whole
        millijoules and whether a counter measured it (None, None: no step)."""
        if step is None:
            return None, None
        self._energy[key] = self._energy.get(key, 0.0) + step.joules
        return round(step.joules * 1000), int(step.method == COUNTER)

    def energy_totals(self) -> list[tuple[str, int, str, str, float]]:
        """(node, GPU index, GPU name, UUID, joules) of every GPU's energy recorded since the history began, and
        of the rest of each machine with GPU index HOST where it was measured or estimated: never less than before,
        across serve's restarts, killed ones too: only what the file holds (written with the rows they count, each
        second), which is what a restart starts from."""
        names = {id_: name for name, id_ in self._nodes.items()}
        return [(names.get(node, "?"), gpu, *self._gpus.get((node, gpu), ("", "")), joules)
                for (node, gpu), joules in sorted(self._energy_written.items())]

    def _state(self, event: NodeStateChanged) -> None:
        node = self._node(event.node)
        first = node not in self._seen
        self._seen.add(node)
        if event.state is NodeState.ONLINE:
            if node in self._down:
                self._down.discard(node)
                self._new.append(("close_down", (event.at, node)))
            return
        self._last_sample.pop(node, None)  # the next sample starts afresh: no GPU time across a gap
        self._steps.forget(node)  # nor energy
        if node in self._down or (first and event.state is NodeState.CONNECTING):
            return  # already offline; or the connecting a session starts with
        self._down.add(node)
        self._new.append(("open_down", (node, event.state.value, event.reason, event.at)))

    _HANDLERS = {NodeStatsUpdated: _stats, NodeStateChanged: _state}

    # -- the small tables, kept in memory, written with the next flush --------------------------------

    def _node(self, name: str) -> int:
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = max(self._nodes.values(), default=0) + 1
            self._new.append(("node", (node, name)))
        return node

    def _owner(self, key: OwnerKey) -> int:
        owner = self._owners.get(key)
        if owner is None:
            owner = self._owners[key] = max(self._owners.values(), default=0) + 1
            self._new.append(("owner", (owner, *key)))
        return owner

    def _gpu_name(self, node: int, index: int, gpu) -> None:
        names = self._gpus[(node, index)] = (str(gpu.name), str(gpu.uuid))  # NA is "n/a"
        self._new.append(("gpu", (node, index, *names)))

    def _start_session(self) -> int:
        """A new recording session; offline intervals a previous one left open (it ended without
        close()) end where it last wrote."""
        now = self.clock()
        with transaction(self._db):
            self._db.execute("UPDATE node_down SET stop = max(start, coalesce((SELECT max(stop) FROM sessions), "
                             "start)) WHERE stop IS NULL")
            return self._db.execute("INSERT INTO sessions VALUES (?, ?)", (now, now)).lastrowid


_NEW = {
    "node": "INSERT INTO nodes VALUES (?, ?)",
    "owner": "INSERT INTO owners VALUES (?, ?, ?, ?, ?, ?)",
    "gpu": "INSERT OR REPLACE INTO gpus VALUES (?, ?, ?, ?)",
    "open_down": "INSERT INTO node_down VALUES (?, ?, ?, ?, NULL)",
    "close_down": "UPDATE node_down SET stop = ? WHERE node = ? AND stop IS NULL",
}
