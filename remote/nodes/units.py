"""Sizes as people read them: memory and disk in GiB (the stats agent reports MiB), data in decimal units."""

from __future__ import annotations

from homegpu.remote.events import NA

MIB_PER_GIB = 1024
MIB = 1024 ** 2  # bytes in a MiB, the unit the stats agent and the timeline give memory in


def is_number(value: object) -> bool:
    """Whether a stats field holds a number (not NA, None or a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def gib(mib: object, width: int = 0) -> str:
    """MiB in GiB with one decimal ("79.6"), right-aligned in `width`; "n/a" where it is not a number."""
    value = mib / MIB_PER_GIB if is_number(mib) else NA
    return f"{value:>{width}.1f}"


def format_bytes(count: float) -> str:
    """Decimal units, as network speeds and downloads are: "102.4 MB", "512 B"."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"
