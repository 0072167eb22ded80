"""Text from a node made safe to show a person: its control characters become visible, never sent.

Whatever a node says (a GPU's or a process's name, a state file's fields, a command's stderr) may
carry terminal controls: OSC 0 retitles the terminal, OSC 52 writes its clipboard, CSI 2J clears
the screen, and \\x9b is CSI on its own. A shared lab box where others name their processes is
enough to send them. So the front ends show every control character as the escape a person reads
in Python (ESC as `\\x1b`, a newline as `\\n`): each one alone, so a sequence split across writes
or cut short by a column width is harmless too, and the form is plain ASCII nothing re-interprets.

The data itself stays exact (`status --json` prints it as the node said it; JSON escapes controls):
this is applied where text reaches a person, at the front ends' few entrances (tui/cli/terminal.py for
the commands' output, the TUI's view and its notices and dialogs, serve's /metrics labels). Rich markup
is the front end's own concern: the TUI never parses node text as markup.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TypeVar

T = TypeVar("T")

# C0, DEL and C1: what a terminal may act on rather than print.
_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # newline and tab stay
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _shown(match: re.Match) -> str:
    char = match.group()
    return _NAMED.get(char) or f"\\x{ord(char):02x}"


def visible(text: str, multiline: bool = False) -> str:
    """`text` with each control character shown as its escape (`\\x1b`, `\\x9b`, `\\n`).

    Args:
        multiline: keep newlines and tabs (text meant to span lines: stderr, a report); a `\\r\\n`
            is then a newline. Otherwise they are shown too, and the result is one line.

    Returns:
        `text` itself when it holds no control character (so NA stays NA), else the visible form.
    """
    pattern = _LINES if multiline else _ONE_LINE
    if not pattern.search(text):
        return text
    if multiline:
        text = text.replace("\r\n", "\n")
    return pattern.sub(_shown, text)


def visible_fields(value: T) -> T:
    """`value` with every string in it made `visible` (one line each): through dataclasses (frozen
    too), tuples, lists and dicts, rebuilding only what holds a string that changed. Anything else
    (numbers, NA, enums without controls) is returned as it is."""
    if isinstance(value, str):
        return visible(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for field in dataclasses.fields(value):
            if field.init:
                old = getattr(value, field.name)
                new = visible_fields(old)
                if new is not old:
                    changes[field.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, (tuple, list)):
        items = [visible_fields(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        pairs = {key: (visible_fields(key), visible_fields(item)) for key, item in value.items()}
        if all(new_key is key and new is value[key] for key, (new_key, new) in pairs.items()):
            return value
        return dict(pairs.values())
    return value
