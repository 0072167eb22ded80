"""The queue's file: its table, how it is created and opened, and the one-line errors for a damaged one.

A file of its own beside the history (location.py): the history is bounded and drops its oldest rows,
the queue must lose nothing. Ids come from AUTOINCREMENT, so a number is never given twice, even after
rows are deleted. A new file is built under a temporary name and renamed into place, so the path never
holds half a store. Times are Unix seconds; `overrides` and `after` are JSON lists.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Iterator

from homegpu.remote.queue.entries import QueueError

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


def cannot_write(path: Path, exc: BaseException) -> QueueError:
    return QueueError(f"cannot write the queue {path} ({exc}): check that its folder is writable and has free space")


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on an autocommit connection (BEGIN IMMEDIATE: the write lock is taken first,
    so a read-then-write cannot interleave with another writer); rolled back if the block raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def create(path: Path) -> None:
    """Make an empty queue at `path` (its folder too, private to its user), atomically."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    building = path.with_name(f"{path.name}.new-{os.getpid()}")
    building.unlink(missing_ok=True)
    db = sqlite3.connect(building, isolation_level=None)
    try:
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.executescript(f"BEGIN; {SCHEMA} COMMIT;")
    finally:
        db.close()
    os.chmod(building, 0o600)  # who queued what, with which settings, is its user's own
    os.replace(building, path)


def check(db: sqlite3.Connection, path: Path) -> None:
    """Whether an open file is a whole queue of this version. Raises QueueDamaged."""
    try:
        if db.execute("PRAGMA application_id").fetchone()[0] != APPLICATION_ID:
            raise damaged(path, "not a homegpu queue file")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version != SCHEMA_VERSION:
            raise damaged(path, f"queue format {version}, this homegpu reads {SCHEMA_VERSION}")
        verdict = db.execute("PRAGMA quick_check").fetchone()
        if verdict != ("ok",):
            raise damaged(path, verdict[0] if verdict else "quick_check said nothing")
        db.execute("SELECT id, job, overrides, after, priority, submitted, user, state, run_id, reason, started, "
                   "ended FROM entries LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            raise
        raise damaged(path, str(exc)) from None


def open_queue(path: Path) -> sqlite3.Connection:
    """A connection to the queue at `path` (created if missing; an existing file is checked first).

    Raises:
        QueueDamaged: the file is not a usable queue.
        QueueError: it cannot be created or opened for writing.
    """
    path = Path(path)
    try:
        if not path.exists():
            create(path)
    except (OSError, sqlite3.Error) as exc:
        raise cannot_write(path, exc) from None
    if not path.is_file():
        raise damaged(path, "not a file")
    if path.stat().st_size == 0:  # SQLite would take it for a new, empty database
        raise damaged(path, "an empty file")
    try:
        db = sqlite3.connect(path, isolation_level=None)
    except sqlite3.DatabaseError as exc:
        raise cannot_write(path, exc) from None
    try:
        check(db, path)  # before anything is changed: a file not ours is left as it was
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")  # a start recorded is on disk before its launch begins
    except sqlite3.Error as exc:
        db.close()
        raise cannot_write(path, exc) from None
    except BaseException:
        db.close()
        raise
    return db
