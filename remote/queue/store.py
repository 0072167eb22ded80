"""The queue's entries kept in SQLite, so that serve's restart loses none and starts none twice.

Every change is one transaction. The one that matters most is `mark_starting`: the runner records an
entry as starting, with the run id it is about to launch under, *before* the launch begins, and only
if the entry is still waiting (so two passes, or a cancel racing a start, cannot both win). A serve
killed at any point after that finds the entry starting or running on restart, never waiting, so it
never launches it again. What the runner does with those on restart (resume.py, `resume_action`):

- its run's workers are on the nodes (a homegpu worker of that run id in the nodes' stats, or
  `JobRuntimes` lists them): attach to the run as `homegpu run` attaches, and mark it running;
- none is: a `starting` entry failed before or during its launch, a `running` one ended while serve
  was away; finish it as failed with the reason (or with the outcome the run left, where it is known).

`homegpu run` knows nothing of the queue; the queue's runs are ordinary runs with an id chosen first.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from homegpu.remote.queue.entries import EntryState, QueueEntry, QueueError, entry_id, entry_number
from homegpu.remote.queue.schema import cannot_write, open_queue, transaction

_COLUMNS = "id, job, overrides, after, priority, submitted, user, state, run_id, reason, started, ended"
MAX_PRIORITY = 1_000_000  # far beyond any real use; keeps the column an ordinary integer


class QueueStore:
    """The queue file's one writer (serve). Not thread-safe: use it from one thread (serve's loop)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._db = open_queue(self.path)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> QueueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading ---------------------------------------------------------------------------------

    def get(self, id_: str) -> QueueEntry:
        """The entry `id_` ("q-12"). Raises QueueError if there is none."""
        row = self._db.execute(f"SELECT {_COLUMNS} FROM entries WHERE id = ?", (entry_number(id_),)).fetchone()
        if row is None:
            raise QueueError(f"no queue entry {entry_id(entry_number(id_))}: `homegpu queue` lists them")
        return _entry(row)

    def entries(self, states: Iterable[EntryState] | None = None) -> list[QueueEntry]:
        """Every entry (or those in `states`), oldest first."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM entries ORDER BY id").fetchall()
        wanted = None if states is None else set(states)
        return [entry for entry in map(_entry, rows) if wanted is None or entry.state in wanted]

    def unfinished(self) -> list[QueueEntry]:
        """The entries a restarted serve must look at first: starting or running (see the module's docstring)."""
        return self.entries((EntryState.STARTING, EntryState.RUNNING))

    # -- changing --------------------------------------------------------------------------------

    def submit(self, job: str, *, overrides: Sequence[str] = (), after: Sequence[str] = (), priority: int = 0,
               user: str, now: float) -> QueueEntry:
        """Add a waiting entry; its id is one more than any ever given.

        Raises:
            QueueError: an `after` id names no entry, or the priority is out of range.
        """
        if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
            raise QueueError(f"priority {priority} is out of range: use a whole number from "
                             f"-{MAX_PRIORITY} to {MAX_PRIORITY} (higher starts first)")
        waits_for = tuple(dict.fromkeys(entry_id(entry_number(item)) for item in after))
        with self._write() as db:
            for item in waits_for:
                if db.execute("SELECT 1 FROM entries WHERE id = ?", (entry_number(item),)).fetchone() is None:
                    raise QueueError(f"--after {item}: no such queue entry; `homegpu queue` lists them")
            cursor = db.execute(
                "INSERT INTO entries (job, overrides, after, priority, submitted, user, state) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (job, json.dumps(list(overrides)), json.dumps(list(waits_for)), priority, now, user,
                 EntryState.WAITING.value))
            number = cursor.lastrowid
        return self.get(entry_id(number))

    def mark_starting(self, id_: str, run_id: str, now: float) -> QueueEntry:
        """Record that `id_` starts as run `run_id`, before its launch begins (see the module's docstring).

        Raises:
            QueueError: it is no longer waiting (cancelled, or already started): do not launch it.
        """
        if not run_id:
            raise ValueError("a start needs its run id")
        with self._write() as db:
            changed = db.execute(
                "UPDATE entries SET state = ?, run_id = ?, started = ?, reason = '' WHERE id = ? AND state = ?",
                (EntryState.STARTING.value, run_id, now, entry_number(id_), EntryState.WAITING.value)).rowcount
        entry = self.get(id_)
        if not changed:
            raise QueueError(f"{entry.id} is {entry.state.value}, not waiting: it is not started again")
        return entry

    def mark_running(self, id_: str) -> QueueEntry:
        """Its workers run (launched, or attached to on restart). Raises QueueError unless it was starting
        or running."""
        return self._move(id_, EntryState.RUNNING, (EntryState.STARTING, EntryState.RUNNING), "", None)

    def finish(self, id_: str, state: EntryState, reason: str, now: float) -> QueueEntry:
        """Its run ended (succeeded, failed) or was stopped (cancelled). Raises QueueError unless it was
        starting or running."""
        if not state.finished:
            raise ValueError(f"{state.value} is not how a run ends")
        return self._move(id_, state, (EntryState.STARTING, EntryState.RUNNING), reason, now)

    def cancel(self, id_: str, reason: str, now: float) -> QueueEntry:
        """Cancel `id_`. A waiting entry is cancelled here and now; a starting or running one is returned
        unchanged: the runner stops its run, then calls `finish(id, CANCELLED, ...)`.

        Raises:
            QueueError: it has already finished, or there is no such entry.
        """
        with self._write() as db:
            changed = db.execute(
                "UPDATE entries SET state = ?, reason = ?, ended = ? WHERE id = ? AND state = ?",
                (EntryState.CANCELLED.value, reason, now, entry_number(id_), EntryState.WAITING.value)).rowcount
        entry = self.get(id_)
        if not changed and entry.state.finished:
            raise QueueError(f"{entry.id} has already {_ended_words(entry.state)}: there is nothing to cancel")
        return entry

    def note_reasons(self, reasons: Mapping[str, str], state: EntryState = EntryState.WAITING) -> int:
        """Keep why each waiting entry waits (the scheduler's latest word), or for a running one what became of its
        run (it went on with fewer machines), so `homegpu queue` can say it. Entries no longer in `state`, or whose
        reason is the same, are left alone. How many changed."""
        rows = [(reason, entry_number(id_), state.value, reason) for id_, reason in reasons.items()]
        if not rows:
            return 0
        with self._write() as db:
            return db.executemany("UPDATE entries SET reason = ? WHERE id = ? AND state = ? AND reason != ?",
                                  rows).rowcount

    # -- internals -------------------------------------------------------------------------------

    def _move(self, id_: str, state: EntryState, sources: tuple[EntryState, ...], reason: str,
              ended: float | None) -> QueueEntry:
        marks = ", ".join("?" for _ in sources)
        with self._write() as db:
            changed = db.execute(
                f"UPDATE entries SET state = ?, reason = ?, ended = ? WHERE id = ? AND state IN ({marks})",
                (state.value, reason, ended, entry_number(id_), *(s.value for s in sources))).rowcount
        entry = self.get(id_)
        if not changed:
            raise QueueError(f"{entry.id} is {entry.state.value}: it cannot become {state.value}")
        return entry

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction whose SQLite failures (a full disk, a read-only folder) are one QueueError line."""
        try:
            with transaction(self._db) as db:
                yield db
        except sqlite3.OperationalError as exc:
            raise cannot_write(self.path, exc) from None


def _ended_words(state: EntryState) -> str:
    return {EntryState.SUCCEEDED: "succeeded", EntryState.FAILED: "failed",
            EntryState.CANCELLED: "been cancelled"}[state]


def _entry(row: tuple) -> QueueEntry:
    number, job, overrides, after, priority, submitted, user, state, run_id, reason, started, ended = row
    return QueueEntry(id=entry_id(number), job=job, overrides=tuple(json.loads(overrides)),
                      after=tuple(json.loads(after)), priority=priority, submitted=submitted, user=user,
                      state=EntryState(state), run_id=run_id, reason=reason, started=started, ended=ended)
