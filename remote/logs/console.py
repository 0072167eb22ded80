"""Console output as a person saw it: raw bytes in, the lines a terminal would finally show out.

A worker's log holds what its script wrote, control characters and all. A Keras progress bar
redraws itself with `\\b` and `\\r` dozens of times per epoch; stored as written it makes one
line of kilobytes. `ConsoleLines` replays the bytes on a one-line terminal model instead:

- `\\r` returns to the line's start and later text overwrites (`\\r\\n` is a plain newline);
  `\\b` moves one column back; a progress bar collapses to its last state.
- ANSI escapes: colours and other styles are dropped; `ESC[K` (erase in line) and the
  horizontal cursor moves (`ESC[nG`, `ESC[nC`, `ESC[nD`) act on the line; the rest (cursor up,
  clear screen, window titles) are dropped. Other control characters are dropped; tabs stay.
- Bytes that are not UTF-8 become U+FFFD. Chunks may split anywhere, even inside a UTF-8
  sequence or an escape.
- Bounded, however a script prints: a line keeps at most `max_line` characters; what is written
  beyond is measured, not stored, and the line ends with a marker saying how many characters
  were cut (characters, not bytes: after overwrites only the final columns count; for ASCII
  they are the bytes). Memory stays bounded for a 50 MB line without a newline.
- Trailing blanks are removed (the padding a shorter redraw writes over a longer one).

`consumed` counts the input bytes up to and including the last newline, so a caller that
follows a file by byte offset (tail.FileResume) can resume at the start of the unfinished line,
after `rewind()`.

Usage:
    console = ConsoleLines()
    for line in console.feed(chunk): ...      # each chunk as it arrives, split anywhere
    for line in console.flush(): ...          # at the end of the stream: the unfinished line
    console.rewind()                          # after a reconnect: re-feed from console.consumed
"""

from __future__ import annotations

import codecs
import re

MAX_LINE = 64 * 1024
_MAX_PENDING_ESCAPE = 256  # an escape still open after this many characters is dropped

_TOKENS = re.compile(
    r"(?P<text>[^\x00-\x08\x0a-\x1f\x7f-\x9f]+)"
    r"|(?P<newline>\n)|(?P<cr>\r)|(?P<bs>\x08+)"
    r"|\x1b\[(?P<csi_params>[0-?]*)[ -/]*(?P<csi_final>[@-~])"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: a window title, a hyperlink
    r"|\x1b[()*+][ -~]"  # a character set (tput sgr0 prints ESC ( B)
    r"|(?P<open_escape>\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[()*+])?\Z)"
    r"|\x1b[^\[\]()*+]"
    r"|[\x00-\x1f\x7f-\x9f]"  # other control characters
)


class ConsoleLines:
    """Turns a byte stream into completed console lines; see the module docstring.

    Args:
        max_line: characters kept per line; more is cut with a marker (default 64 Ki).

    Attributes:
        consumed: input bytes through the last newline fed (all bytes fed, after `flush()`).
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self.consumed = 0
        self._fed = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._pending_escape = ""
        self._line = ""  # at most max_line characters
        self._cursor = 0  # may pass max_line: what is written there is dropped
        self._width = 0  # the line's width on a terminal, kept part or not
        self._unfinished = False  # bytes arrived since the last newline

    def feed(self, chunk: bytes) -> list[str]:
        """The lines that `chunk` completed, as a terminal would finally show them."""
        if not chunk:
            return []
        last_newline = chunk.rfind(b"\n")
        self._fed += len(chunk)
        if last_newline >= 0:
            self.consumed = self._fed - len(chunk) + last_newline + 1
        self._unfinished = last_newline < len(chunk) - 1  # bytes of a next line arrived
        return self._apply(self._pending_escape + self._decoder.decode(chunk))

    def flush(self) -> list[str]:
        """End of stream: the unfinished line, if any bytes of one arrived, as a last line."""
        lines = self._apply(self._pending_escape + self._decoder.decode(b"", final=True))
        self._decoder.reset()
        self._pending_escape = ""
        if self._unfinished:
            lines.append(self._take_line())
        self._unfinished = False
        self.consumed = self._fed
        return lines

    def rewind(self) -> None:
        """Forget the unfinished line: the next `feed` starts again at byte `consumed` (a file tail
        resumed at that offset after a reconnect re-reads the unfinished line from its start)."""
        self._decoder.reset()
        self._pending_escape = ""
        self._line, self._cursor, self._width = "", 0, 0
        self._unfinished = False
        self._fed = self.consumed

    @property
    def partial(self) -> str:
        """The unfinished line as a terminal shows it right now ("" when there is none)."""
        return self._shown()

    def _apply(self, text: str) -> list[str]:
        self._pending_escape = ""
        lines = []
        for token in _TOKENS.finditer(text):
            kind = token.lastgroup
            if kind == "text":
                self._write(token.group())
            elif kind == "newline":
                lines.append(self._take_line())
            elif kind == "cr":
                self._cursor = 0
            elif kind == "bs":
                self._cursor = max(0, self._cursor - len(token.group()))
            elif kind == "csi_final":
                self._csi(token.group("csi_params"), token.group("csi_final"))
            elif kind == "open_escape" and len(token.group()) < _MAX_PENDING_ESCAPE:
                self._pending_escape = token.group()  # completed by the next chunk
        return lines

    def _write(self, text: str) -> None:
        """Write `text` at the cursor, overwriting; what falls beyond max_line is only measured."""
        start, end = self._cursor, self._cursor + len(text)
        text = text[:max(0, self.max_line - start)]
        if text:
            if start > len(self._line):
                self._line += " " * (start - len(self._line))  # the cursor was moved right
            self._line = self._line[:start] + text + self._line[start + len(text):]
        self._cursor = end
        self._width = max(self._width, end)

    def _csi(self, params: str, final: str) -> None:
        """The line-local ANSI controls; every other CSI sequence (colours too) is dropped."""
        first = params.split(";")[0]
        number = int(first) if first.isdigit() else None
        if final == "K":
            if number in (None, 0):
                self._line = self._line[:self._cursor]
                self._width = min(self._width, self._cursor)
            elif number == 1:
                self._line = " " * min(self._cursor + 1, len(self._line)) + self._line[self._cursor + 1:]
            elif number == 2:
                self._line, self._width = "", 0
        elif final == "G":
            self._cursor = max(0, (number or 1) - 1)
        elif final == "C":
            self._cursor += max(1, number or 1)
        elif final == "D":
            self._cursor = max(0, self._cursor - max(1, number or 1))

    def _shown(self) -> str:
        line = self._line.rstrip()
        if self._width > self.max_line:
            line += f" … [{self._width - self.max_line} characters cut: line longer than {self.max_line}]"
        return line

    def _take_line(self) -> str:
        line = self._shown()
        self._line, self._cursor, self._width = "", 0, 0
        return line
