"""LogPane: one bounded log buffer on screen, with follow, a filter and wrapping.

It draws only the rows in view (Textual's line API), from a buffer tui/view/state.py bounds, so a
container that prints 20,000 lines a second costs one rebuild of at most LOG_LINES rows per refresh,
never a widget per line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Iterable

from rich.cells import cell_len
from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip

from homegpu.remote.logs import is_harmless_tf_notice
from homegpu.tui.view.state import LogEntry

_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def clean(text: str) -> str:
    """Drop terminal escapes and control characters a container printed; tabs become spaces."""
    return _CONTROL.sub("", text).replace("\t", "    ")


def format_entries(entries: Iterable[LogEntry], node_tab: str = "") -> list[str]:
    """Lines as shown: "worker | text", without the prefix in a node's own tab when the node runs
    a single worker of the same name."""
    lines = []
    for entry in entries:
        if node_tab and entry.worker == node_tab:
            lines.append(clean(entry.text))
        else:
            lines.append(f"{entry.worker} | {clean(entry.text)}")
    return lines


def matching(lines: Sequence[str], pattern: str) -> list[str]:
    """Lines containing `pattern`, ignoring case (all lines for an empty pattern)."""
    if not pattern:
        return list(lines)
    needle = pattern.lower()
    return [line for line in lines if needle in line.lower()]


def wrap_rows(lines: Sequence[str], width: int) -> list[str]:
    """Each line cut into rows of `width` cells (a hard wrap: log lines are rarely prose)."""
    if width <= 0:
        return list(lines)
    rows = []
    for line in lines:
        if len(line) <= width:
            rows.append(line)
        else:
            rows.extend(line[i:i + width] for i in range(0, len(line), width))
    return rows


class LogPane(ScrollView, can_focus=True):
    """Shows `buffer` (a deque the app keeps filling); call `sync()` after it changed."""

    DEFAULT_CSS = """
    LogPane { background: $surface; overflow: auto auto; }
    """

    follow: var[bool] = var(True)
    wrap: var[bool] = var(False)
    pattern: var[str] = var("")

    def __init__(self, buffer: Sequence[LogEntry], node_tab: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.buffer, self.node_tab = buffer, node_tab
        self.lines: list[str] = []  # filtered, unwrapped: what "save" writes
        self._rows: list[str] = []
        self._version = 0
        self._built_for: tuple | None = None

    def sync(self, version: int | None = None) -> None:
        """Rebuild the rows if the buffer (its `version`), filter, wrap or width changed since the
        last build. The app calls it for the view on screen only: a hidden tab catches up when shown."""
        if version is not None:
            self._version = version
        key = (self._version, len(self.buffer), self.pattern, self.wrap, self.size.width)
        if key == self._built_for:
            return
        self._built_for = key
        self.lines = matching(format_entries(self.buffer, self.node_tab), self.pattern)
        self._rows = wrap_rows(self.lines, self.size.width) if self.wrap else self.lines
        widest = self.size.width if self.wrap else max((cell_len(row) for row in self._rows[-2000:]), default=0)
        self.virtual_size = Size(widest, len(self._rows))
        if self.follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        self.refresh()

    def watch_follow(self, follow: bool) -> None:
        if follow:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_resize(self) -> None:
        self.sync()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if index >= len(self._rows):
            return Strip.blank(width, style)
        row = self._rows[index]
        text = Text(row, style=style, no_wrap=True)
        if is_harmless_tf_notice(row.partition(" | ")[2] or row):  # TensorFlow's noise on CPU-only nodes
            text.stylize("dim")
        if self.pattern:
            text.highlight_words([self.pattern], "reverse", case_sensitive=False)
        segments = list(text.render(self.app.console))
        strip = Strip(segments or [Segment("", style)], cell_len(text.plain))
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)
