"""What the commands print reaches the terminal as text, never as a control sequence.

The commands print node data in many places (names in `status`, `jobs` and `tfconfig`, stderr in
`doctor` and in `run`'s preflight and error lines). Rather than a call at each, `visible_output()`
puts a filter on stdout and stderr for the whole command: every control character but newline and
tab is written in its visible form (remote/nodes/visible.py). homegpu itself prints no escape but
`status --watch`'s screen clear, which goes to `unfiltered(sys.stdout)`. The TUI draws through
Textual's own stream and cleans its data where it takes it in (tui/view/state.py, tui/app/main.py).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator, TextIO

from homegpu.remote.nodes import visible


class VisibleStream:
    """A text stream that writes each control character in its visible form; the rest is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.unfiltered = stream

    def write(self, text: str) -> int:
        self.unfiltered.write(visible(text, multiline=True))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self.unfiltered, name)  # flush, fileno, isatty, encoding ...


@contextlib.contextmanager
def visible_output() -> Iterator[None]:
    """For the block, sys.stdout and sys.stderr write node text visibly (see the module docstring)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = VisibleStream(sys.stdout), VisibleStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def unfiltered(stream: TextIO) -> TextIO:
    """The stream under the filter, for an escape homegpu sends on purpose."""
    return getattr(stream, "unfiltered", stream)
