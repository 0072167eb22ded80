"""The history file's size bound: the database and its write-ahead log together stay under `max_bytes`.

The bound is split: the WAL gets an eighth (at least 128 KiB, at most 4 MiB; SQLite checkpoints it at
half that and cuts it back after), the database the rest. The database's pages in use are read
after every write (two header reads, no scan); past 90 % of its share, the oldest rows go, oldest
first, whichever tier they are in (the oldest are the coarsest), until 80 % is in use: in
transactions of a few thousand rows, since every page a transaction frees passes through the WAL.
Freed pages are reused by the rows that follow, so the file stops growing; it is cut back
(incremental vacuum, in chunks) only when it is larger than its share, as when the bound was lowered.
A WAL that grew past its share anyway (a reader held a checkpoint back) is checkpointed and
truncated as soon as no reader is in the way. SQLite's -shm index (32 KiB) is not counted.
"""

from __future__ import annotations

import math
import os
import sqlite3
from pathlib import Path

from homegpu.remote.history.schema import SAMPLE_TABLES
from homegpu.remote.history.tiers import drop_before, oldest_sample
from homegpu.remote.nodes import MIB
from homegpu.remote.store import transaction

DEFAULT_MAX_BYTES = 256 * MIB
MIN_MAX_BYTES = 1 * MIB
HIGH, LOW = 0.90, 0.80  # trim when this share of the database's part is in use, down to this
ROW_BYTES = 40  # about what a sample row takes on disk, its share of the key included
VACUUM_CHUNK_PAGES = 16  # pages given back per transaction, so a vacuum never fills the WAL


def check_max_bytes(max_bytes: int) -> int:
    """`max_bytes` if it is a size the store can keep to.

    Raises:
        ValueError: it is not (one line, with the smallest allowed).
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < MIN_MAX_BYTES:
        raise ValueError(f"the history's size bound must be at least {MIN_MAX_BYTES} bytes (1 MiB), "
                         f"not {max_bytes!r}")
    return max_bytes


class SizeBound:
    """Keeps one store (its writer's connection) under `max_bytes`; see the module docstring."""

    def __init__(self, db: sqlite3.Connection, path: Path, max_bytes: int) -> None:
        self.db, self.path, self.max_bytes = db, Path(path), check_max_bytes(max_bytes)
        self.wal_bytes = min(4 * MIB, max(128 * 1024, max_bytes // 8))
        self.db_bytes = max_bytes - self.wal_bytes
        self.page_size = db.execute("PRAGMA page_size").fetchone()[0]
        frame = self.page_size + 24  # a WAL frame: the page and its header
        db.execute(f"PRAGMA wal_autocheckpoint = {max(4, self.wal_bytes // 2 // frame)}")
        db.execute(f"PRAGMA journal_size_limit = {self.wal_bytes // 2}")
        self.rows_per_step = max(100, self.wal_bytes // 2 // ROW_BYTES // len(SAMPLE_TABLES))
        self.trims = 0  # how many times the oldest rows had to go (for tests and benchmarks)

    def pages(self) -> tuple[int, int]:
        """(pages in the file, pages of it in use)."""
        count = self.db.execute("PRAGMA page_count").fetchone()[0]
        free = self.db.execute("PRAGMA freelist_count").fetchone()[0]
        return count, count - free

    def keep(self) -> None:
        """After a write: trim the oldest rows if the database is near its share, give pages back if
        the file is over it, and cut a WAL that outgrew its share."""
        count, used = self.pages()
        if used * self.page_size > HIGH * self.db_bytes:
            self._trim()
            count, used = self.pages()
        if count * self.page_size > self.db_bytes:
            self._vacuum(count - self.db_bytes // self.page_size)
            self._truncate_wal()  # the file shrinks when the vacuumed pages are checkpointed into it
        elif self._wal_size() > self.wal_bytes:
            self._truncate_wal()

    def _trim(self) -> None:
        self.trims += 1
        while self.pages()[1] * self.page_size > LOW * self.db_bytes:
            cutoff = self._cutoff()
            if cutoff is None:
                return  # no samples left: the small tables alone cannot reach the bound
            with transaction(self.db):
                drop_before(self.db, cutoff)
            if self._wal_size() > self.wal_bytes:
                self._truncate_wal()

    def _cutoff(self) -> float | None:
        """A time before which each sample table holds at most rows_per_step rows (None: no samples)."""
        found = [row[0] for table in SAMPLE_TABLES for row in self.db.execute(
            f"SELECT t FROM {table} ORDER BY t LIMIT 1 OFFSET ?", (self.rows_per_step,))]
        if found:
            oldest = oldest_sample(self.db)
            return max(min(found), math.nextafter(oldest, math.inf))  # rows sharing the oldest time go together
        newest = [row[0] for table in SAMPLE_TABLES for row in self.db.execute(f"SELECT max(t) FROM {table}")
                  if row[0] is not None]
        return max(newest) + 1 if newest else None  # fewer rows than a step in all: they all go

    def _vacuum(self, pages: int) -> None:
        """Give up to `pages` free pages back to the file system, a chunk per transaction."""
        while pages > 0 and self.db.execute("PRAGMA freelist_count").fetchone()[0] > 0:
            chunk = min(pages, VACUUM_CHUNK_PAGES)
            # executescript steps the pragma to its end; execute() would free a single page.
            self.db.executescript(f"PRAGMA incremental_vacuum({chunk});")
            pages -= chunk

    def _wal_size(self) -> int:
        try:
            return os.stat(self.path.with_name(self.path.name + "-wal")).st_size
        except FileNotFoundError:
            return 0

    def _truncate_wal(self) -> None:
        """Checkpoint and truncate the WAL, without waiting: a reader in the way makes it a try for later."""
        self.db.execute("PRAGMA busy_timeout = 0")
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.OperationalError:
            pass  # busy: the next write tries again
        finally:
            self.db.execute("PRAGMA busy_timeout = 5000")
