"""A size in cluster.toml, as a job's `gpu_memory` takes it: a number with a unit (`"5GiB"`, `"512MiB"`,
`"8GB"`, `"5G"`), in bytes.

KiB, MiB, GiB and TiB count by 1024, as nvidia-smi does; KB, MB, GB and TB by 1000, as a card's box does;
K, M, G and T alone by 1024, as Docker's `--memory` does. A bare number is refused: 5 alone is 5 bytes to
one reader and 5 GiB to another.
"""

from __future__ import annotations

import re

from homegpu.trainer.gpu_budget import budget_text as size_text  # one way to say a size, shipped too

UNIT_BYTES = {"b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3, "t": 1024 ** 4,
              "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3, "tib": 1024 ** 4,
              "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
EXAMPLES = '"5GiB", "512MiB" or "8GB"'  # as an error's hint says them
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")


def size_bytes(value: object) -> int | None:
    """`value` in bytes: text as `"5GiB"`, `"512 MiB"`, `"8GB"`; None when it is not a size (a number
    without a unit, a boolean, an unknown unit, a word)."""
    if not isinstance(value, str):
        return None
    match = _SIZE.fullmatch(value.strip().lower())
    if match is None or match[2] not in UNIT_BYTES:
        return None
    return int(float(match[1]) * UNIT_BYTES[match[2]])


def size_key(size: int) -> str:
    """`size` as cluster.toml takes it back, exactly, in its largest whole unit: "5GiB", "8GB", else "1001B"."""
    for unit in ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "KB"):
        if size % UNIT_BYTES[unit.lower()] == 0:
            return f"{size // UNIT_BYTES[unit.lower()]}{unit}"
    return f"{size}B"
