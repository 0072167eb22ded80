"""The queue panel: the queue `homegpu serve` runs, as the rows `homegpu queue` prints (tui/view/queue_text.py),
with one entry selected for `c` to cancel. `u` puts it in the logs' place and back, so it fits wherever the
logs do (160×48 and 80×24 alike) and moves no other panel.

The app asks serve while the panel is on screen and hands each answer here: the entries, or the QueueError
that says why there are none. No serve is the panel's one line saying how to start one, never a toast.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from homegpu.remote.nodes import visible
from homegpu.remote.queue import EntryState, NoServe, QueueEntry, QueueError
from homegpu.tui.view.queue_text import COLUMNS, ordered, queue_row
from homegpu.tui.view.render import drawn_alike

WIDE = 110  # columns (the app's wide breakpoint): under it the run id gives way, so that WHY stays in view
NARROW_COLUMNS = tuple(column for column in COLUMNS if column != "RUN")
EMPTY = "the queue is empty: l, then u in the dialog, queues a job for serve"
ASKING = "asking serve …"
KEYS = "↑/↓ select · c cancel · u logs"
STATE_STYLES = {EntryState.WAITING: "yellow", EntryState.STARTING: "green", EntryState.RUNNING: "bold green",
                EntryState.SUCCEEDED: "", EntryState.FAILED: "red", EntryState.CANCELLED: "dim"}

Answer = Sequence[QueueEntry] | QueueError


def no_serve_line(serve_command: str) -> str:
    """The panel's one line when no serve answers: what to type to start one for this cluster file."""
    return f"no serve runs this cluster's queue: start one with `{serve_command}`"


def counts(entries: Sequence[QueueEntry], shown: int) -> str:
    """"1 running · 2 waiting · 3 finished" (and how many older finished are left out)."""
    active = sum(1 for e in entries if e.state.active)
    waiting = sum(1 for e in entries if e.state is EntryState.WAITING)
    finished = len(entries) - active - waiting
    parts = [f"{n} {word}" for n, word in ((active, "running"), (waiting, "waiting"), (finished, "finished")) if n]
    hidden = len(entries) - shown
    return " · ".join(parts) + (f" (the latest {finished - hidden} shown)" if hidden > 0 else "")


class QueuePanel(Vertical):
    """serve's queue: a line when there is nothing to list (no serve, an error, an empty queue), else a table."""

    def __init__(self, serve_command: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.serve_command = serve_command
        self.entries: list[QueueEntry] = []  # as shown, in order
        self.answers = 0  # how many of serve's answers (or failures to answer) were shown
        self._answer: Answer | None = None
        self._now = 0.0
        self._columns: tuple[str, ...] = ()
        self._rows: dict[str, tuple[Text, ...]] = {}

    def compose(self) -> ComposeResult:
        yield Static(ASKING, id="queue-note")
        yield DataTable(id="queue-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.border_title = "queue"
        self.query_one(DataTable).display = False

    def on_resize(self) -> None:
        self.redraw()  # the run id's column comes and goes with the width

    @property
    def note(self) -> str:
        """The line shown instead of the table ("" while the table shows)."""
        note = self.query_one("#queue-note", Static)
        return str(note.render()) if note.display else ""

    def show(self, answer: Answer, now: float) -> None:
        """Show serve's answer: its entries (running, then waiting in start order, then the latest finished),
        or the error that says why there are none."""
        self._answer, self._now = answer, now
        self.answers += 1
        self.redraw()

    def redraw(self) -> None:
        """Draw the last answer for the width the app has now (after a resize too)."""
        if self._answer is None:
            return
        if isinstance(self._answer, QueueError):
            line = no_serve_line(self.serve_command) if isinstance(self._answer, NoServe) else str(self._answer)
            self._show_line(visible(line), "serve")
            return
        shown = ordered(self._answer)
        if not shown:
            self._show_line(EMPTY, "")
            return
        self.border_title = "queue · " + counts(self._answer, len(shown))
        self.border_subtitle = KEYS
        self.query_one("#queue-note", Static).display = False
        self.query_one(DataTable).display = True
        self._fill(shown)

    def _show_line(self, line: str, title: str) -> None:
        self.entries, self._rows = [], {}
        self.border_title, self.border_subtitle = "queue" + (f" · {title}" if title else ""), "u logs"
        note = self.query_one("#queue-note", Static)
        note.update(Text(line))
        note.display = True
        self.query_one(DataTable).display = False

    def _fill(self, shown: list[QueueEntry]) -> None:
        """Update the table in place, or rebuild it (keeping the selected entry) when its rows or columns change."""
        table = self.query_one(DataTable)
        columns = COLUMNS if self.app.size.width >= WIDE else NARROW_COLUMNS
        rows = {entry.id: self._cells(entry, columns) for entry in shown}
        if columns == self._columns and list(rows) == list(self._rows):
            for id_, cells in rows.items():
                for column, cell, old in zip(columns, cells, self._rows[id_]):
                    if not drawn_alike(cell, old):
                        table.update_cell(id_, column, cell, update_width=True)
        else:
            selected = self.selected()
            table.clear(columns=columns != self._columns)
            if columns != self._columns:
                for column in columns:
                    table.add_column(column, key=column)
            for id_, cells in rows.items():
                table.add_row(*cells, key=id_)
            ids = list(rows)
            table.move_cursor(row=ids.index(selected.id) if selected and selected.id in ids else 0)
        self.entries, self._rows, self._columns = shown, rows, columns

    def _cells(self, entry: QueueEntry, columns: tuple[str, ...]) -> tuple[Text, ...]:
        """The entry's row as Text (a job's settings may hold `[`: never read as markup)."""
        by_column = dict(zip(COLUMNS, queue_row(entry, self._now)))
        return tuple(Text(by_column[column], style=STATE_STYLES[entry.state] if column == "STATE" else "")
                     for column in columns)

    def selected(self) -> QueueEntry | None:
        """The entry under the table's cursor, if the table shows."""
        table = self.query_one(DataTable)
        if not table.display or not self.entries or not 0 <= table.cursor_row < len(self.entries):
            return None
        return self.entries[table.cursor_row]
