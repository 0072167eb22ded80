"""Slurm's hostlist expressions ("node[1-3,5],gpu-a"), expanded and compressed as `scontrol show hostnames`
and `scontrol show hostlist` do.

Slurm names a job's nodes this way everywhere (SLURM_JOB_NODELIST, squeue's NODELIST, sinfo, the
"UnavailableNodes:" of a pending reason), so the run needs the names one by one to build TF_CONFIG, and a
message wants them short again. Brackets may hold single numbers and ranges; a lower bound's leading
zeros set the width (`rack[01-03]` is rack01, rack02, rack03), and several brackets in one name multiply,
the first outermost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HOSTS = 65536  # more names than any cluster has: an expression past it is a mistake, not a job's nodes
_BRACKET = re.compile(r"\[([^\[\]]*)\]")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_NUMBERED = re.compile(r"(.*?)(\d+)")


class HostlistError(ValueError):
    """An expression that is not a hostlist: the message says what is wrong with it."""


def expand(expression: str) -> list[str]:
    """Every name of a hostlist expression, in Slurm's order ("node[1-2],gpu" → node1, node2, gpu).

    Raises:
        HostlistError: unbalanced brackets, a range that runs backwards, an empty name, too many names.
    """
    names: list[str] = []
    for entry in _top_level_entries(expression):
        names.extend(_expand_entry(entry))
        if len(names) > MAX_HOSTS:
            raise HostlistError(f"{expression[:60]!r} names more than {MAX_HOSTS} hosts")
    return names


def _top_level_entries(expression: str) -> list[str]:
    """The expression split at the commas outside brackets, checking the brackets balance."""
    entries, depth, start = [], 0, 0
    for index, char in enumerate(expression):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise HostlistError(f"{expression[:60]!r} has unbalanced or nested brackets")
        if char == "," and depth == 0:
            entries.append(expression[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"{expression[:60]!r} has an unclosed bracket")
    entries.append(expression[start:])
    if any(not entry.strip() for entry in entries):
        raise HostlistError(f"{expression[:60]!r} has an empty name")
    return [entry.strip() for entry in entries]


def _expand_entry(entry: str) -> list[str]:
    """One name with its brackets multiplied out, the first bracket outermost."""
    match = _BRACKET.search(entry)
    if not match:
        return [entry]
    head, tail = entry[:match.start()], entry[match.end():]
    rest = _expand_entry(tail)
    return [head + number + after for number in _numbers(match.group(1), entry) for after in rest]


def _numbers(inside: str, entry: str) -> list[str]:
    """The numbers a bracket's inside lists ("01-03,7" → 01, 02, 03, 7), each padded to its range's width."""
    numbers: list[str] = []
    for item in inside.split(","):
        match = _RANGE.fullmatch(item.strip())
        if not match:
            raise HostlistError(f"{entry[:60]!r}: {item!r} is not a number or a range of them")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"{entry[:60]!r}: the range {item!r} runs backwards")
        if int(high) - int(low) >= MAX_HOSTS:
            raise HostlistError(f"{entry[:60]!r}: the range {item!r} names more than {MAX_HOSTS} hosts")
        numbers.extend(str(number).zfill(len(low)) for number in range(int(low), int(high) + 1))
    return numbers


@dataclass
class _Run:
    """Consecutive names that share a prefix and a number width: node1..node3 is ("node", 1, 3, 1)."""

    prefix: str
    low: int
    high: int
    width: int
    numbered: bool = True

    def takes(self, prefix: str, number: int, width: int) -> bool:
        return (self.numbered and prefix == self.prefix and number == self.high + 1
                and _widths_agree(self.width, width, self.low, number))

    def inside(self) -> str:
        """The run as a bracket writes it: "1-3", "5", "01-03"."""
        low = str(self.low).zfill(self.width)
        return low if self.low == self.high else f"{low}-{str(self.high).zfill(self.width)}"


def _widths_agree(width: int, other: int, low: int, number: int) -> bool:
    """node9 then node10 continue a run (neither is zero-padded); node09 then node10 do too; node9 then
    node010 do not."""
    if width == other:
        return True
    padded = len(str(low)) < width or len(str(number)) < other
    return not padded


def compress(names: list[str]) -> str:
    """Names as one hostlist expression, in their order, as `scontrol show hostlist` writes it: consecutive
    numbers become a range, neighbouring runs of one prefix share a bracket ("node[1-3,5],gpu-a")."""
    runs: list[_Run] = []
    for name in names:
        match = _NUMBERED.fullmatch(name)
        if not match:
            runs.append(_Run(name, 0, 0, 0, numbered=False))
            continue
        prefix, digits = match.group(1), match.group(2)
        if runs and runs[-1].takes(prefix, int(digits), len(digits)):
            runs[-1].high = int(digits)
        else:
            runs.append(_Run(prefix, int(digits), int(digits), len(digits)))
    return ",".join(_write(group) for group in _neighbours(runs))


def _neighbours(runs: list[_Run]) -> list[list[_Run]]:
    """Runs grouped where neighbours share a numbered prefix: each group is written as one name."""
    groups: list[list[_Run]] = []
    for run in runs:
        last = groups[-1][-1] if groups else None
        if last is not None and run.numbered and last.numbered and run.prefix == last.prefix:
            groups[-1].append(run)
        else:
            groups.append([run])
    return groups


def _write(group: list[_Run]) -> str:
    first = group[0]
    if not first.numbered:
        return first.prefix
    if len(group) == 1 and first.low == first.high:
        return first.prefix + first.inside()
    return f"{first.prefix}[{','.join(run.inside() for run in group)}]"
