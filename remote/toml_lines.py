"""Where each key of a TOML document is written: tomllib gives values only, errors need lines."""

from __future__ import annotations

import re

_KEY = r'(?:[A-Za-z0-9_-]+|"[^"]*"|\'[^\']*\')'
_ARRAY_HEADER = re.compile(rf"^\s*\[\[\s*({_KEY}(?:\s*\.\s*{_KEY})*)\s*\]\]")
_TABLE_HEADER = re.compile(rf"^\s*\[\s*({_KEY}(?:\s*\.\s*{_KEY})*)\s*\]")
_ASSIGNMENT = re.compile(rf"^\s*({_KEY}(?:\s*\.\s*{_KEY})*)\s*=")


def _split_key(dotted: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in re.findall(_KEY, dotted))


class LineIndex:
    """Maps key paths such as ("nodes", 1, "port") to 1-based line numbers.

    A line-oriented scan, good for the hand-written files homegpu reads; a key it cannot place
    falls back to its table's header line.
    """

    def __init__(self, text: str) -> None:
        self._lines: dict[tuple, int] = {}
        self._scan(text)

    def _scan(self, text: str) -> None:
        table: tuple = ()
        array_counts: dict[tuple, int] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if match := _ARRAY_HEADER.match(line):
                name = _split_key(match.group(1))
                index = array_counts.get(name, 0)
                array_counts[name] = index + 1
                table = name + (index,)
                self._lines.setdefault(name, number)
            elif match := _TABLE_HEADER.match(line):
                table = _split_key(match.group(1))
            elif match := _ASSIGNMENT.match(line):
                self._lines.setdefault(table + _split_key(match.group(1)), number)
                continue
            else:
                continue
            self._lines.setdefault(table, number)

    def find(self, path: tuple) -> int | None:
        """The line of `path`, else of its nearest enclosing table, else None."""
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None
