"""What every homegpu SQLite file of its own does alike (serve's history, its queue): made atomically under a
temporary name and marked as homegpu's, one transaction at a time on an autocommit connection, and opened for
writing only after it was checked, so that a file that is not ours is left as it was. Each store keeps its
own schema, its check and the words of its errors.

Each is its user's alone (who ran what, where, for how long): 0600 in a 0700 folder. SQLite makes the -wal and
-shm beside a file with the file's own mode, so a 0600 file keeps them 0600 too; a store, its -wal and -shm and
its folder that an older homegpu left open (0644, 0755) are closed when it is opened for writing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Callable, Iterator, Sequence

from homegpu.remote.nodes import format_bytes


@contextlib.contextmanager
def transaction(db: sqlite3.Connection, immediate: bool = False) -> Iterator[sqlite3.Connection]:
    """One transaction on an autocommit connection: committed if the block ends, rolled back if it raises.
    `immediate` takes the write lock first, so a read-then-write cannot interleave with another writer."""
    db.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def create_atomically(path: Path, application_id: int, version: int, schema: str, pragmas: Sequence[str] = ()) -> None:
    """Make an empty store at `path` (its folder too, 0700) under a temporary name, then rename it into place,
    so the path never holds half a store. The file is 0600 before anything is written to it. `pragmas` run
    first (auto_vacuum must precede the first table)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    building = path.with_name(f"{path.name}.new-{os.getpid()}")
    building.unlink(missing_ok=True)
    os.close(os.open(building, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # SQLite takes an empty file as new
    db = sqlite3.connect(building, isolation_level=None)
    try:
        for pragma in pragmas:
            db.execute(f"PRAGMA {pragma}")
        db.execute(f"PRAGMA application_id = {application_id}")
        db.execute(f"PRAGMA user_version = {version}")
        db.executescript(f"BEGIN; {schema} COMMIT;")
    finally:
        db.close()
    os.replace(building, path)


def _keep_private(path: Path) -> None:
    """Close a store that an older homegpu left open to others: its folder to 0700, the file and its -wal and
    -shm to 0600, each where it is ours and more open than that."""
    _no_more_than(path.parent, 0o700)
    for suffix in ("", "-wal", "-shm"):
        _no_more_than(path.with_name(path.name + suffix), 0o600)


def _no_more_than(path: Path, mode: int) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(info.st_mode) & mode)


def check_store(db: sqlite3.Connection, application_id: int, version: int, kind: str, pages: bool,
                damaged: Callable[[str], Exception]) -> None:
    """The checks every store starts with: its marks say it is homegpu's `kind` of this `version` and (`pages`)
    every page reads back. An SQLite error on the way says the file is not a whole store, except another
    connection's lock, which is not the file's fault and passes through. Raises what `damaged(why)` makes."""
    with errors_as_damage(damaged):
        found_id = db.execute("PRAGMA application_id").fetchone()[0]
        found_version = db.execute("PRAGMA user_version").fetchone()[0]
        if found_id != application_id:
            raise damaged(f"not a homegpu {kind} file")
        if found_version != version:
            raise damaged(f"{kind} format {found_version}, this homegpu reads {version}")
        if pages:
            verdict = db.execute("PRAGMA quick_check").fetchone()
            if verdict != ("ok",):
                raise damaged(verdict[0] if verdict else "quick_check said nothing")


@contextlib.contextmanager
def errors_as_damage(damaged: Callable[[str], Exception]) -> Iterator[None]:
    """SQLite errors in the block become `damaged(why)`; a lock held elsewhere (busy, locked) passes through."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            raise
        raise damaged(str(exc)) from None


def open_for_writing(path: Path, create: Callable[[Path], None], check: Callable[[sqlite3.Connection], None],
                     pragmas: Sequence[str], damaged: Callable[[str], Exception],
                     cannot_write: Callable[[BaseException], Exception]) -> sqlite3.Connection:
    """The store's writing connection: `create` makes the file where there is none; an existing one is
    `check`ed before anything is changed; then it is made private (_keep_private) and `pragmas` apply.

    Raises:
        what `damaged(why)` makes: the file is not a whole store of ours (empty, not a file, `check`'s verdict).
        what `cannot_write(exc)` makes: it cannot be created or opened for writing.
    """
    try:
        if not path.exists():
            create(path)
    except (OSError, sqlite3.Error) as exc:
        raise cannot_write(exc) from None
    if not path.is_file():
        raise damaged("not a file")
    if path.stat().st_size == 0:  # SQLite would take it for a new, empty database
        raise damaged("an empty file")
    try:
        db = sqlite3.connect(path, isolation_level=None)
    except sqlite3.DatabaseError as exc:
        raise cannot_write(exc) from None
    try:
        check(db)  # before anything is changed: a file not ours is left as it was
        _keep_private(path)
        for pragma in pragmas:
            db.execute(f"PRAGMA {pragma}")
    except (OSError, sqlite3.Error) as exc:
        db.close()
        raise cannot_write(exc) from None
    except BaseException:
        db.close()
        raise
    return db


def room_left(path: Path) -> str:
    """Where `path`'s writes go and how much room is left there, for a line about a write that failed:
    "/var/lib on /var: 0 B free"."""
    folder = Path(path).parent
    mount = folder
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return f"the filesystem at {mount}"
    return f"the filesystem at {mount} has {format_bytes(free)} free"
