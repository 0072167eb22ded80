"""The one rule for averaging samples into time buckets, shared by the run's timeline (in SQL) and
the TUI's history (in Python): bucket i of size s holds the samples with i*s <= t < (i+1)*s and
stands at its middle, i*s + s/2. Pure; times are unix seconds (positive, so truncating is flooring).
"""

from __future__ import annotations


def bucket_index(t: float, size: float) -> int:
    """The bucket that time `t` falls in."""
    return int(t // size)


def bucket_time(index: int, size: float) -> float:
    """Where bucket `index` stands on the time axis: its middle."""
    return index * size + size / 2


def bucket_time_sql(column: str, size: float) -> str:
    """The SQL expression for bucket_time(bucket_index(column, size), size) (SQLite; `column` >= 0)."""
    return f"(CAST({column} / {size} AS INTEGER) * {size} + {size / 2})"
