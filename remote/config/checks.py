"""What every part of cluster.toml is validated with: the one-line ConfigError and the shared checks.

cluster_spec.py (the file and [cluster]), node_spec.py ([[nodes]]) and job_spec.py ([jobs.NAME]) walk
the parsed TOML with one Validator, so every mistake reads the same: `file:line: key: problem; hint`.
Values quoted in a message are shortened and escaped (see `show`), so however hostile the file, the
message stays one short line.
"""

from __future__ import annotations

import difflib
import math
import re
import reprlib
import tomllib
from typing import Any, Callable

from homegpu.remote.config.durations import Duration, duration_hint, duration_seconds
from homegpu.remote.config.key_tables import ALERTS, CLUSTER, JOBS, NODES
from homegpu.remote.config.toml_lines import LineIndex

# Hosts and paths end up in argv lists sent to remote shells; shlex.join quotes them, and refusing
# anything unusual up front means a typo can never become an option or a second command.
HOST_RE = re.compile(r"[A-Za-z0-9_.:%\[\]-]+")
PATH_RE = re.compile(r"[A-Za-z0-9_./~+@=,:-]+")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # names, tags, users: up to 64 characters
SHELL_META = frozenset(";&|`$<>()\\\"' \t\n*?!{}#")
TOP_KEYS = ("cluster", "nodes", "jobs", "alerts")
MAX_PORT = 65535
_MAX_SHOWN_PARTS = 6  # of a key path in a message

Check = Callable[[tuple, Any], None]
Limits = dict[str, tuple[float, float, str]]  # key: (lowest, highest, unit), as in_range takes them


class ConfigError(Exception):
    """A mistake in cluster.toml, located and explained in one line."""

    def __init__(self, file: str, line: int | None, key: str, problem: str, hint: str) -> None:
        self.file, self.line, self.key, self.problem, self.hint = file, line, key, problem, hint
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {key}: {problem}; {hint}")


class Validator:
    """Walks the parsed TOML once, raising the first mistake with its location.

    Each `check_*` method and each check a factory returns takes (key path, value) and raises
    ConfigError, so they plug into `getter`.
    """

    def __init__(self, file: str, lines: LineIndex) -> None:
        self.file = file
        self.lines = lines

    def fail(self, path: tuple, problem: str, hint: str) -> ConfigError:
        return ConfigError(self.file, self.lines.find(path), display(path), problem, hint)

    def table(self, data: dict, path: tuple) -> dict:
        value = data.get(path[-1], {})
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a table, not {type_name(value)}",
                            f"write it as a {display(path)} table")
        return value

    def unknown_keys(self, table: dict, path: tuple, allowed: frozenset[str], hint: str) -> None:
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
                suggestion = f"did you mean {close[0]!r}? " if close else ""
                raise self.fail(path + (key,), f"unknown key {show(key)}", f"{suggestion}{hint}")

    def getter(self, table: dict, path: tuple, limits: Limits | None = None) -> Callable[..., Any]:
        """`get(key, kind, default, check=None)`: the key's value, type-checked, within its `limits`
        (lowest, highest, unit) if it has any, and checked; else `default`. Kind `Duration` reads any
        duration form (durations.py) as seconds."""
        def get(key: str, kind: type, default: Any, check: Check | None = None) -> Any:
            if key not in table:
                return default
            if kind is Duration:
                value = self.check_duration(path + (key,), table[key], (limits or {}).get(key))
            else:
                value = self.check_type(path + (key,), table[key], kind)
            if limits and key in limits and kind is not Duration:
                self.in_range(*limits[key])(path + (key,), value)
            if check:
                check(path + (key,), value)
            return value

        return get

    def check_type(self, path: tuple, value: Any, kind: type) -> Any:
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise self.fail(path, f"{show(value)} is far too large", "use an ordinary number") from None
        if _fits(value, kind):
            return value
        raise self.fail(path, f"expected {_KIND_NAMES[kind]}, got {type_name(value)} {show(value)}",
                        f"write it like {_example_line(path, kind)}")

    def check_duration(self, path: tuple, value: Any, limits: tuple[float, float, str] | None) -> float:
        """A duration key's seconds, within `limits` (lowest, highest, unit) if given: every duration key
        is read and refused alike, its message quoting the value as written."""
        seconds = duration_seconds(value)
        if seconds is None:
            problem = (f"{show(value)} is not a duration" if isinstance(value, str)
                       else f"expected a duration, got {type_name(value)} {show(value)}")
            raise self.fail(path, problem, duration_hint(key_text(path[-1])))
        if limits and not limits[0] <= seconds <= limits[1]:  # also refuses NaN
            lowest, highest, unit = limits
            raise self.fail(path, f"must be from {_limit(lowest)} to {_limit(highest)}{unit}, got {show(value)}",
                            "use a duration in that range")
        return seconds

    def in_range(self, lowest: float, highest: float, unit: str = "") -> Check:
        """A check that a number is finite and within [lowest, highest]; the message names both."""
        def check(path: tuple, value: float) -> None:
            if not lowest <= value <= highest:  # also refuses NaN, which compares false
                raise self.fail(path, f"must be from {_limit(lowest)} to {_limit(highest)}{unit}, got {show(value)}",
                                "use a number in that range")
        return check

    def check_port(self, path: tuple, value: int) -> None:
        if not 1 <= value <= MAX_PORT:
            raise self.fail(path, f"port {show(value)} is out of range", f"use a port between 1 and {MAX_PORT}")

    def choice(self, choices: tuple[str, ...], hint: str = "", what: str = "value") -> Check:
        """A check that a string is one of `choices`."""
        def check(path: tuple, value: str) -> None:
            if value not in choices:
                raise self.fail(path, f"unknown {what} {show(value)}",
                                hint or "use one of: " + ", ".join(f'"{c}"' for c in choices))
        return check

    def check_name(self, path: tuple, value: str) -> None:
        if not NAME_RE.fullmatch(value):
            raise self.fail(path, f"invalid name {show(value)}",
                            "use up to 64 letters, digits, - _ and . (starting with a letter or digit)")

    def check_name_like(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a user name")
        if not NAME_RE.fullmatch(value):
            raise self.fail(path, f"invalid user name {show(value)}", "use a plain login name such as alice")

    def check_host(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a host name")
        if not HOST_RE.fullmatch(value):
            raise self.fail(path, f"invalid host {show(value)}",
                            "use a host name, an IP address or an ~/.ssh/config alias")

    def check_path(self, path: tuple, value: str) -> None:
        self.check_safe(path, value, "a path")
        if not PATH_RE.fullmatch(value):
            raise self.fail(path, f"invalid path {show(value)}", "use a plain path of letters, digits and / . _ - ~")

    def check_safe(self, path: tuple, value: str, what: str) -> None:
        if value.startswith("-"):
            raise self.fail(path, f"{show(value)} starts with '-' and would be read as an option",
                            f"write {what} without the leading '-'")
        bad = sorted(set(value) & SHELL_META)
        if bad:
            raise self.fail(path, f"{show(value)} contains shell metacharacters {''.join(bad)!r}",
                            f"write {what} without them")


def _limit(number: float) -> str:
    return f"{number:,}" if isinstance(number, int) else f"{number:g}"


_KIND_NAMES = {bool: "true or false", str: "a string", int: "an integer", float: "a number", list: "a list", dict: "a table"}


# Where a path's key is found: (section, the length of a path to one of its keys).
_SECTIONS = {"cluster": (CLUSTER, 2), "nodes": (NODES, 3), "jobs": (JOBS, 3), "alerts": (ALERTS, 2)}
_KIND_EXAMPLES = {str: '"text"', int: "22", float: "1.5", bool: "true", list: '["a", "b"]', dict: '{ KEY = "value" }'}


def _example_line(path: tuple, kind: type) -> str:
    """The key's own example from the reference (`min_workers = 2`), where it is a value of `kind`; else one
    that shows the kind (`epochs = 22`)."""
    section, depth = _SECTIONS.get(path[0], (None, 0)) if path else (None, 0)
    key = next((k for k in section.keys if k.name == path[-1]), None) if section and len(path) == depth else None
    if key is not None:
        if _fits(tomllib.loads(key.example).get(key.name), kind):
            return key.example
    return f"{key_text(path[-1])} = {_KIND_EXAMPLES[kind]}"


def _fits(value: Any, kind: type) -> bool:
    """Whether `value` is a TOML value of `kind` as check_type takes it: a whole number is a number too, a
    boolean is no integer."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, kind) or kind is float and isinstance(value, int)


def type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


class _Short(reprlib.Repr):
    """reprlib with room for real values, and integers too long for str() (4,300 digits) summarised."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 80
        self.maxlevel, self.maxlist, self.maxdict = 3, 6, 4

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() <= 200:
            return repr(x)
        return f"<an integer of about {int(x.bit_length() * math.log10(2)) + 1} digits>"


_SHORT = _Short()


def show(value: Any) -> str:
    """A value as a message quotes it: repr-like, escaped, at most about 80 characters, any depth."""
    return _SHORT.repr(value)


def key_text(key: Any) -> str:
    """A key as written in TOML: bare when it can be, else quoted, escaped and shortened."""
    text = str(key) if isinstance(key, int) else key
    if isinstance(text, str) and len(text) <= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", text):
        return text
    return show(key)


def display(path: tuple) -> str:
    """A TOML-like name for a key: `[cluster].work_dir`, `[[nodes]] #2.port`, `[jobs.train]`."""
    if not path:
        return "(top level)"
    head, rest = path[0], path[1:]
    if head == "nodes" and rest and isinstance(rest[0], int):
        label = f"[[nodes]] #{rest[0] + 1}"
        rest = rest[1:]
    elif head == "jobs" and rest:
        label, rest = f"[jobs.{key_text(rest[0])}]", rest[1:]
    elif head in TOP_KEYS:
        label = "[[nodes]]" if head == "nodes" else f"[{head}]"
    else:
        return key_text(head)
    shown = "".join(f".{key_text(key)}" for key in rest[:_MAX_SHOWN_PARTS])
    return label + shown + (".…" if len(rest) > _MAX_SHOWN_PARTS else "")
