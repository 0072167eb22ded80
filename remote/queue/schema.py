"""The queue's file: its table, how it is created and opened, and the one-line errors for a damaged one.

A file of its own beside the history (location.py): the history is bounded and drops its oldest rows,
the queue must lose nothing. Ids come from AUTOINCREMENT, so a number is never given twice, even after
rows are deleted. A new file is built under a temporary name and renamed into place, so the path never
holds half a store. Times are Unix seconds; `overrides` and `after` are JSON lists.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from homegpu.remote.queue.entries import QueueError, QueueWriteError
from homegpu.remote.store import (
    check_store, create_atomically, errors_as_damage, open_for_writing, room_left, transaction as sqlite_transaction,
)

APPLICATION_ID = 0x68677071  # "hgpq": PRAGMA application_id, which marks the file as homegpu's queue
SCHEMA_VERSION = 1  # PRAGMA user_version
BUSY_TIMEOUT_MS = 5000  # a reader beside serve waits this long for serve's write to end

SCHEMA = """
CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, overrides TEXT NOT NULL,
    after TEXT NOT NULL, priority INTEGER NOT NULL, submitted REAL NOT NULL, user TEXT NOT NULL,
    state TEXT NOT NULL, run_id TEXT NOT NULL DEFAULT '', reason TEXT NOT NULL DEFAULT '', started REAL, ended REAL);
CREATE INDEX entries_state ON entries (state);
"""


class QueueDamaged(QueueError):
    """The queue file is there but is not a whole queue (truncated, overwritten, not ours)."""


def damaged(path: Path, why: str) -> QueueDamaged:
    return QueueDamaged(f"{path} is damaged ({why}): move it aside (e.g. mv {path} {path}.damaged) and restart "
                        f"serve, which starts an empty queue there; the entries it held are lost")


def cannot_write(path: Path, exc: BaseException) -> QueueWriteError:
    return QueueWriteError(f"cannot write the queue {path} ({exc}; {room_left(path)}): free space there and "
                           "check that its folder is writable")


def transaction(db: sqlite3.Connection):
    """One write transaction that takes the write lock first: a read-then-write cannot interleave with
    another writer; rolled back if the block raises."""
    return sqlite_transaction(db, immediate=True)


def create(path: Path) -> None:
    """Make an empty queue at `path`, atomically: 0600 in a 0700 folder (who queued what, with which
    settings, is its user's own)."""
    create_atomically(path, APPLICATION_ID, SCHEMA_VERSION, SCHEMA)


def check(db: sqlite3.Connection, path: Path) -> None:
    """Whether an open file is a whole queue of this version. Raises QueueDamaged."""
    check_store(db, APPLICATION_ID, SCHEMA_VERSION, "queue", True, lambda why: damaged(path, why))
    with errors_as_damage(lambda why: damaged(path, why)):  # a table missing: not a queue of ours
        db.execute("SELECT id, job, overrides, after, priority, submitted, user, state, run_id, reason, started, "
                   "ended FROM entries LIMIT 1").fetchall()


def open_queue(path: Path) -> sqlite3.Connection:
    """A connection to the queue at `path` (created if missing; an existing file is checked first).

    Raises:
        QueueDamaged: the file is not a usable queue.
        QueueError: it cannot be created or opened for writing.
    """
    path = Path(path)
    # synchronous=FULL: a start recorded is on disk before its launch begins
    return open_for_writing(path, create, lambda db: check(db, path),
                            (f"busy_timeout = {BUSY_TIMEOUT_MS}", "journal_mode = WAL", "synchronous = FULL"),
                            lambda why: damaged(path, why), lambda exc: cannot_write(path, exc))
