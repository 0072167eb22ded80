"""A duration in cluster.toml, read one way for every key that takes one: a number is seconds (`90`, `1.5`,
`"90"`), and text is a number with a unit, or several largest first (`"90s"`, `"5m"`, `"1.5h"`, `"1h30m"`,
`"2d"`, `"1w"`).

checks.py's Validator reads each duration key through `duration_seconds` (the getter's kind `Duration`), so
every key takes the same forms and a mistake in one reads as in another; `homegpu history --since` reads its
age with it too. Slurm's `time_limit` is not one of them: it keeps Slurm's own forms (slurm_keys.py), since
sbatch is handed it as written.
"""

from __future__ import annotations

import math
import re

UNIT_SECONDS = {"w": 604_800, "d": 86_400, "h": 3600, "m": 60, "s": 1}  # largest first, the order text takes
FORMS = 'seconds (`90`), or `"90s"`, `"5m"`, `"1h30m"` (s, m, h, d, w)'  # as the reference says them
_NUMBER = r"\d+(?:\.\d+)?"
_PART = re.compile(rf"({_NUMBER})\s*([wdhms])\s*")
_SECONDS = re.compile(_NUMBER)


class Duration:
    """The kind a Validator getter takes for a duration key: its value is seconds, a float."""


def duration_seconds(value: object) -> float | None:
    """`value` in seconds: a number as it is, text as `"90"`, `"90s"`, `"5m"`, `"1h30m"`; None when it is
    neither (a boolean, a unit twice or out of order, a word). Too large to hold is infinite."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return _float(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if _SECONDS.fullmatch(text):
        return float(text)
    return _with_units(text)


def _with_units(text: str) -> float | None:
    """`"1h30m"` in seconds, each unit at most once and largest first; None when that is not the text."""
    parts, end = [], 0
    for match in _PART.finditer(text):
        if match.start() != end:
            return None
        parts.append((match[1], match[2]))
        end = match.end()
    units = [unit for _, unit in parts]
    order = list(UNIT_SECONDS)
    if not parts or end != len(text) or units != sorted(set(units), key=order.index):
        return None
    return sum(float(number) * UNIT_SECONDS[unit] for number, unit in parts)


def _float(number: int | float) -> float:
    try:
        return float(number)
    except OverflowError:  # an integer beyond a float: a range check refuses it by its size
        return math.inf


def duration_hint(key: str) -> str:
    """How a duration key is written, for its one-line ConfigError."""
    return f'write seconds or a duration, like {key} = 1.5, {key} = "90s", "5m" or "1h30m" (s, m, h, d, w)'
