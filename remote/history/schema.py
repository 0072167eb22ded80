"""The history file's tables, how it is created and opened, and the one-line error for a damaged one.

Every sample table is clustered by time (WITHOUT ROWID, time first in the key): new rows go at the
end, compaction and the size bound delete from the front, and a window is one range scan. Nodes and
owners are small integers pointing into their own tables. Created with auto_vacuum=INCREMENTAL (it
can only be chosen before the first table), so the file can give pages back when the bound shrinks.
A new file is built under a temporary name and renamed into place, so the path never holds half a
store. Times are Unix seconds; values are whole units (see samples.py).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from homegpu.remote.store import check_store, create_atomically, errors_as_damage, open_for_writing, room_left

APPLICATION_ID = 0x68677068  # "hgph": PRAGMA application_id, which marks the file as homegpu's history
SCHEMA_VERSION = 1  # PRAGMA user_version
AUTO_VACUUM_INCREMENTAL = 2

SCHEMA = """
CREATE TABLE nodes (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE gpus (node INTEGER NOT NULL, gpu INTEGER NOT NULL, name TEXT NOT NULL, uuid TEXT NOT NULL,
    PRIMARY KEY (node, gpu)) WITHOUT ROWID;
CREATE TABLE owners (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, user TEXT NOT NULL, job TEXT NOT NULL,
    run_id TEXT NOT NULL, container TEXT NOT NULL, UNIQUE (kind, user, job, run_id, container));
CREATE TABLE node_samples (t REAL NOT NULL, node INTEGER NOT NULL, n INTEGER NOT NULL, cpu INTEGER,
    mem_used INTEGER, mem_total INTEGER, host_mj INTEGER, host_counted INTEGER, PRIMARY KEY (t, node)) WITHOUT ROWID;
CREATE TABLE gpu_samples (t REAL NOT NULL, node INTEGER NOT NULL, gpu INTEGER NOT NULL, n INTEGER NOT NULL,
    util INTEGER, mem_used INTEGER, mem_total INTEGER, temp INTEGER, power INTEGER, energy_mj INTEGER, counted INTEGER,
    PRIMARY KEY (t, node, gpu)) WITHOUT ROWID;
CREATE TABLE owner_samples (t REAL NOT NULL, node INTEGER NOT NULL, gpu INTEGER NOT NULL, owner INTEGER NOT NULL,
    n INTEGER NOT NULL, gpu_ms INTEGER NOT NULL, mem INTEGER, energy_mj INTEGER,
    PRIMARY KEY (t, node, gpu, owner)) WITHOUT ROWID;
CREATE TABLE node_down (node INTEGER NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL, start REAL NOT NULL,
    stop REAL);
CREATE INDEX node_down_stop ON node_down (stop);
CREATE TABLE sessions (start REAL NOT NULL, stop REAL NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value REAL NOT NULL) WITHOUT ROWID;
"""

# The tables of samples, each clustered by time: what compaction, retention and the bound act on.
SAMPLE_TABLES = ("node_samples", "gpu_samples", "owner_samples")
# Columns added since the first histories were written (ALTER TABLE ... ADD COLUMN adds them at the end): a
# GPU's energy since its previous sample in whole millijoules (a few bytes a row, and no rounding that adds up)
# and whether its counter measured it; an owner's share of it; the same of the rest of the machine (RAPL, or
# estimated from idle_watts/busy_watts).
ADDED_COLUMNS = (("gpu_samples", "energy_mj", "INTEGER"), ("gpu_samples", "counted", "INTEGER"),
                 ("owner_samples", "energy_mj", "INTEGER"), ("node_samples", "host_mj", "INTEGER"),
                 ("node_samples", "host_counted", "INTEGER"))


class HistoryError(Exception):
    """The history cannot be used or written; the message is one line naming the file and what to do."""


class HistoryDamaged(HistoryError):
    """The history file is there but is not a whole history (truncated, overwritten, not ours)."""


def is_damage(exc: sqlite3.DatabaseError) -> bool:
    """Whether SQLite's error is about the file's content (corrupt, not a database), not a passing state
    such as another connection's lock."""
    name = getattr(exc, "sqlite_errorname", None) or ""
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or not name


def cannot_write(path: Path, exc: BaseException) -> HistoryError:
    """A write that failed for a reason outside the file's content: a read-only folder, a full disk."""
    return HistoryError(f"cannot write the history {path} ({exc}; {room_left(path)}): free space there and check "
                        f"that its folder is writable, or give homegpu another place for it (XDG_DATA_HOME)")


def damaged(path: Path, why: str) -> HistoryDamaged:
    return HistoryDamaged(
        f"{path} is damaged ({why}): move it aside (e.g. mv {path} {path}.damaged) or delete it; "
        f"a new history is started there")


def create(path: Path) -> None:
    """Make an empty store at `path` (its folder too), atomically, its user's own (0600 in a 0700 folder: who ran
    what, where); auto_vacuum lets the size bound shrink it."""
    create_atomically(path, APPLICATION_ID, SCHEMA_VERSION, SCHEMA, pragmas=("auto_vacuum = INCREMENTAL",))


def check(db: sqlite3.Connection, path: Path, thorough: bool) -> None:
    """Whether an open file is a whole history of this version (`thorough`: read every page once).

    Raises:
        HistoryDamaged: it is not.
    """
    check_store(db, APPLICATION_ID, SCHEMA_VERSION, "history", thorough, lambda why: damaged(path, why))
    with errors_as_damage(lambda why: damaged(path, why)):
        if thorough and db.execute("PRAGMA auto_vacuum").fetchone()[0] != AUTO_VACUUM_INCREMENTAL:
            raise damaged(path, "made without incremental auto_vacuum")
        for table in (*SAMPLE_TABLES, "nodes", "gpus", "owners", "node_down", "sessions", "meta"):
            db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchall()  # a table missing: not a history of ours


def open_writer(path: Path) -> sqlite3.Connection:
    """The store's one writing connection (created if missing; an existing file is checked whole).

    Raises:
        HistoryDamaged: the file is not a usable history.
        HistoryError: it cannot be created or opened for writing.
    """
    path = Path(path)
    # in WAL mode synchronous=NORMAL is durable at checkpoints and never corrupt
    db = open_for_writing(path, create, lambda db: check(db, path, thorough=True),
                          ("journal_mode = WAL", "synchronous = NORMAL"),
                          lambda why: damaged(path, why), lambda exc: cannot_write(path, exc))
    try:
        add_missing_columns(db)
    except sqlite3.OperationalError as exc:
        db.close()
        raise cannot_write(path, exc) from None
    return db


def add_missing_columns(db: sqlite3.Connection) -> None:
    """Bring a history written by an older homegpu up to today's columns (its old rows hold NULL there)."""
    for table, column, kind in ADDED_COLUMNS:
        if not has_column(db, table, column):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def has_column(db: sqlite3.Connection, table: str, column: str) -> bool:
    return any(row[1] == column for row in db.execute(f"PRAGMA table_info({table})"))


def open_reader(path: Path) -> sqlite3.Connection:
    """A connection that only reads, beside a running writer (WAL). Read-write where the file may be
    written (a read-only one that closes last cannot fold the WAL back), read-only otherwise.

    Raises:
        FileNotFoundError: there is no history at `path`.
        HistoryDamaged: the file is not a usable history.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no history at {path}")
    if path.stat().st_size == 0:
        raise damaged(path, "an empty file")
    try:
        try:
            db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=rw", uri=True)
            db.execute("PRAGMA query_only = ON")
        except sqlite3.OperationalError:
            db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    except sqlite3.DatabaseError as exc:
        raise damaged(path, str(exc)) from None
    try:
        check(db, path, thorough=False)
    except HistoryDamaged:
        db.close()
        raise
    return db


_ENERGY_KEY = "energy_joules"  # meta: "energy_joules NODE GPU" -> every joule recorded for that GPU (never less)
HOST = -1  # the GPU index under which the rest of a machine's energy is kept in those totals


def read_energy_totals(db: sqlite3.Connection) -> dict[tuple[int, int], float]:
    """Each GPU's energy recorded since the history began, by (node id, GPU index)."""
    totals = {}
    for key, value in db.execute("SELECT key, value FROM meta WHERE key LIKE ?", (_ENERGY_KEY + " %",)):
        _, node, gpu = key.split()
        totals[(int(node), int(gpu))] = value
    return totals


def write_energy_totals(db: sqlite3.Connection, totals: dict[tuple[int, int], float]) -> None:
    """Store totals (read_energy_totals' shape), inside the caller's transaction, with the rows they count."""
    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                   [(f"{_ENERGY_KEY} {node} {gpu}", joules) for (node, gpu), joules in totals.items()])
