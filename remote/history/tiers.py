"""The history's tiers, like the run timeline's: full rate for the last hour, 10 s buckets for the last
day, 60 s buckets for 30 days, and nothing older.

Buckets follow remote/store's one rule (`bucket_time_sql`: bucket i of size s holds i*s <= t < (i+1)*s
and stands at its middle). A 60 s bucket is made from the 10 s buckets in it, so each tier is made
from the one before. A bucket's value is the mean of the samples in it: finer rows are weighted by
how many samples each holds (`n`), and a NULL (not available) is left out of the mean, not taken as
0. GPU time per owner (`gpu_ms`) and energy (`energy_mj` and the rest of the machine's `host_mj`, and how many
samples' energy a counter measured, `counted` and `host_counted`) are summed, so GPU-hours and kWh come out the same at every tier.

Compaction runs as time goes on, over the slice that has aged since it last ran (a minute's rows in
steady state), in transactions of at most `Tier.step` seconds of rows, so neither a transaction nor
the WAL grows with the size of the store.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from homegpu.remote.history.schema import SAMPLE_TABLES
from homegpu.remote.store import bucket_time_sql, transaction

FULL_RATE_SECONDS = 3600.0
RETENTION_SECONDS = 30 * 86400.0


@dataclass(frozen=True)
class Tier:
    bucket: float  # seconds per bucket
    after: float  # rows older than this (against the clock) are averaged into this tier's buckets
    step: float  # at most this many seconds of rows per transaction
    marker: str  # its key in `meta`: every row before that time is in this tier (or a coarser one)


TIERS = (
    Tier(10.0, FULL_RATE_SECONDS, 600.0, "compacted_10s"),
    Tier(60.0, 86400.0, 3600.0, "compacted_60s"),
)


def weighted_mean(column: str) -> str:
    """SQL for the mean of `column` over a group of rows, each weighted by its samples `n`; NULLs (not
    available) are left out, and a group of NULLs only is NULL."""
    return f"1.0 * sum({column} * n) / sum(CASE WHEN {column} IS NULL THEN NULL ELSE n END)"


def _mean(column: str) -> str:
    return f"round({weighted_mean(column)})"  # a bucket keeps whole units, like a sample


def _counted(counted: str, energy: str) -> str:
    """A bucket's samples measured by a counter: all of its `n` where every step with energy was (the sample
    before a bucket's first step has none, yet belongs to the counter's stretch), else those that were. So
    `counted` against `n` still tells "counter", "integrated" and "mixed" apart in every tier."""
    with_energy = f"sum(CASE WHEN {energy} IS NULL THEN 0 ELSE n END)"
    return f"CASE WHEN sum({counted}) = {with_energy} THEN sum(n) ELSE sum({counted}) END"


# table -> (its key columns besides t, the aggregates of its value columns in column order)
_BUCKETED = {
    "node_samples": ("node", f"sum(n), {_mean('cpu')}, {_mean('mem_used')}, max(mem_total), sum(host_mj), "
                             f"{_counted('host_counted', 'host_mj')}"),
    "gpu_samples": ("node, gpu", f"sum(n), {_mean('util')}, {_mean('mem_used')}, max(mem_total), {_mean('temp')}, "
                                 f"{_mean('power')}, sum(energy_mj), {_counted('counted', 'energy_mj')}"),
    "owner_samples": ("node, gpu, owner", f"sum(n), sum(gpu_ms), {_mean('mem')}, sum(energy_mj)"),
}
_COLUMNS = {"node_samples": 8, "gpu_samples": 11, "owner_samples": 8}
INSERT = {table: f"INSERT OR REPLACE INTO {table} VALUES ({', '.join('?' * count)})"
          for table, count in _COLUMNS.items()}


def _floor(t: float, size: float) -> float:
    return math.floor(t / size) * size


def oldest_sample(db: sqlite3.Connection, since: float = -math.inf) -> float | None:
    """The time of the oldest sample row at or after `since` (None: there is none)."""
    found = [row[0] for table in SAMPLE_TABLES
             for row in db.execute(f"SELECT min(t) FROM {table} WHERE t >= ?", (since,)) if row[0] is not None]
    return min(found) if found else None


def compact_range(db: sqlite3.Connection, size: float, since: float, until: float) -> None:
    """Replace the rows in [since, until) by their `size` buckets (whole buckets: both ends are multiples
    of `size`). Inside the caller's transaction; deletes before it inserts, so freed pages are reused."""
    bucket = bucket_time_sql("t", size)
    for table, (keys, aggregates) in _BUCKETED.items():
        rows = db.execute(f"SELECT {bucket} AS b, {keys}, {aggregates} FROM {table} "
                          f"WHERE t >= ? AND t < ? GROUP BY b, {keys}", (since, until)).fetchall()
        db.execute(f"DELETE FROM {table} WHERE t >= ? AND t < ?", (since, until))
        db.executemany(INSERT[table], rows)


def drop_before(db: sqlite3.Connection, cutoff: float) -> None:
    """Delete every row older than `cutoff`: samples, offline intervals over by then, recording sessions.
    Inside the caller's transaction."""
    for table in SAMPLE_TABLES:
        db.execute(f"DELETE FROM {table} WHERE t < ?", (cutoff,))
    db.execute("DELETE FROM node_down WHERE stop < ?", (cutoff,))
    db.execute("DELETE FROM sessions WHERE stop < ?", (cutoff,))


class Compactor:
    """Moves rows down the tiers as the clock goes on, and drops what is older than the retention.

    Its markers live in the file's `meta` table, so a reopened store goes on where it stopped (and
    catches up on what aged while it was closed).
    """

    def __init__(self, db: sqlite3.Connection, tiers: tuple[Tier, ...] = TIERS,
                 retention: float = RETENTION_SECONDS) -> None:
        self.db, self.tiers, self.retention = db, tiers, retention
        stored = dict(db.execute("SELECT key, value FROM meta"))
        self.markers = {tier.marker: stored.get(tier.marker, -math.inf) for tier in tiers}

    @property
    def full_rate_since(self) -> float:
        """Rows before this are already bucketed: a sample older than it (one that arrives over an hour
        late) would land among buckets, so the recorder drops it."""
        return self.markers[self.tiers[0].marker]

    def run(self, now: float) -> None:
        for tier in self.tiers:
            self._compact(tier, now)
        cutoff = now - self.retention
        oldest = oldest_sample(self.db)
        if oldest is not None and oldest < cutoff:
            with transaction(self.db):
                drop_before(self.db, cutoff)

    def _compact(self, tier: Tier, now: float) -> None:
        """Bucket what aged into `tier` since it last ran. The marker is stored with the rows it bucketed;
        moved over a range without rows it is only kept in memory (no write a minute per idle tier):
        reopened from an older marker, the next run finds the same rows to bucket."""
        until = _floor(now - tier.after, tier.bucket)
        since = self.markers[tier.marker]
        while since < until:
            first = oldest_sample(self.db, since)
            start = until if first is None else max(since, _floor(first, tier.bucket))
            if start >= until:
                self.markers[tier.marker] = until  # nothing to bucket up to there
                return
            stop = min(until, start + tier.step)
            with transaction(self.db):
                compact_range(self.db, tier.bucket, start, stop)
                self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (tier.marker, stop))
            since = self.markers[tier.marker] = stop
