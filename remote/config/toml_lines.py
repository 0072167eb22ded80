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
        self._paths: dict[int, tuple] = {}
        self.longest_key: tuple[int, int | None] = (0, None)  # (dotted parts, line) of the longest key
        self._scan(text)

    def _scan(self, text: str) -> None:
        table: tuple = ()
        array_counts: dict[tuple, int] = {}
        for number, line in enumerate(text.split("\n"), start=1):  # as tomllib counts lines
            if match := _ARRAY_HEADER.match(line):
                key = _split_key(match.group(1))
                index = array_counts.get(key, 0)
                array_counts[key] = index + 1
                self._lines.setdefault(key, number)
                table = path = key + (index,)
            elif match := _TABLE_HEADER.match(line):
                key = table = path = _split_key(match.group(1))
            elif match := _ASSIGNMENT.match(line):
                key = _split_key(match.group(1))
                path = table + key
            else:
                continue
            self._lines.setdefault(path, number)
            self._paths.setdefault(number, path)
            if len(key) > self.longest_key[0]:
                self.longest_key = (len(key), number)

    def find(self, path: tuple) -> int | None:
        """The line of `path`, else of its nearest enclosing table, else None."""
        while path:
            if path in self._lines:
                return self._lines[path]
            path = path[:-1]
        return None

    def path_at(self, line: int | None) -> tuple:
        """The key written on `line` (an assignment or a table header), else ()."""
        return self._paths.get(line, ()) if line else ()
