"""A Python traceback in a worker's output, read line by line as the lines arrive.

A worker's last traceback says whether a failed run was a script error (remote/jobs/failure.py), and
the front ends show it once, bounded (traceback_fold.py). Its header can be hundreds of lines above
the log's end (an exception whose message dumps a tensor), so it is read as it comes, never searched
for afterwards. TracebackReader keeps, bounded: the last FRAME_LINES printed lines of its frames and
the last frame of the user's code however deep, the exception line, the message's first
MESSAGE_LINES lines, its last line and a count of the rest.

Where a message ends is not printed: it runs on until a line that is plainly something else (a new
traceback, a metric or Keras progress line, a TensorFlow or logging line, "Epoch N/M", the line
homegpu's supervisor writes when the worker exited).

Pure: no I/O.
"""

from __future__ import annotations

import collections
import posixpath
import re
from dataclasses import dataclass, replace

from homegpu.remote.logs.classify import classify

TRACEBACK_HEADER = "Traceback (most recent call last):"
FRAME_LINES = 40  # printed lines of a traceback's frames kept (the deepest ones)
MESSAGE_LINES = 5  # lines of an exception's message kept after its first, with its last line
SOURCE_LINES = 4  # lines under a frame's `File` line kept with it (its source and the ^^^ marks)
MAX_CHARS = 400  # of one kept line: a megabyte line stays bounded
MAX_STRAYS = 50  # other lines among a traceback's frames (another thread's) before it is given up

# The roles `TracebackReader.feed` gives a line.
TEXT = "text"  # ordinary output; a traceback's message before it (if any) is over
START = "start"  # a traceback's header, or the `File` line a SyntaxError in the main script starts with
FRAME = "frame"  # a line of its frames: its exception is not known yet
EXCEPTION = "exception"  # its exception line: `TracebackReader.current` is the traceback
MESSAGE = "message"  # a further line of the exception's message
CHAIN = "chain"  # "During handling of the above exception, ..." between chained tracebacks
RELEASED = "released"  # what looked like a traceback was not: `released` holds its lines, then this one

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?$')
_EXCEPTION_LIKE = re.compile(r"^[A-Za-z_][\w.]*(?::.*)?$")
# A headerless block (a SyntaxError in the main script) must end in a plainly named exception.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
_CHAIN = re.compile(r"^(?:During handling of the above exception, another exception occurred:"
                    r"|The above exception was the direct cause of the following exception:)$")
_LOGGING = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\S")
_OTHER_OUTPUT = re.compile(
    r"^(?:\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"  # TensorFlow's older C++ log lines, logging's asctime
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d"  # glog and absl (TensorFlow 2.17+)
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):\S"  # logging.basicConfig's format
    r"|Epoch \d+/\d+\s*$"  # Keras starting an epoch
    r"|\s*\d+/(?:\d+|Unknown)\s+(?:\[|━)"  # Keras's progress bar
    r"|Exception ignored in"
    r"|=== homegpu: .* ===$)")  # the worker's supervisor's notes (below)
_SUPERVISOR_NOTE = re.compile(r"^=== homegpu: .* ===$")
# PyTorch's prefix on what a process under torchrun prints to stderr: "[rank1]: Traceback ...".
_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ")
# torchrun's own traceback when a process it started failed: it says only that; the process's is the one.
_LAUNCHER_WRAPPER = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError"
# Files that are not the user's code: Python's own library, installed packages, frozen or generated
# code, and homegpu's (the trainer and the script bootstrap live under _homegpu/ in the synced code).
_NOT_USERS = re.compile(r"(?:^|/)(?:site-packages|dist-packages|_homegpu)/|/lib(?:64)?/python\d[\d.]*/|^<")


def is_supervisor_note(text: str) -> bool:
    """A line the worker's supervisor (node_side/scripts/worker_process.py) wrote: it started, it exited."""
    return bool(_SUPERVISOR_NOTE.match(text.strip()))


def _is_header(text: str) -> bool:
    return text.startswith(TRACEBACK_HEADER) and not text[len(TRACEBACK_HEADER):].strip()


def is_user_file(path: str) -> bool:
    """Whether a traceback's file is the user's code (see _NOT_USERS)."""
    return not _NOT_USERS.search(path)


def clip(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


@dataclass(frozen=True)
class Frame:
    """One frame of a traceback: its file and line, and `lines` as printed (its `File` line first)."""

    file: str
    line: int
    lines: tuple[str, ...] = ()

    def where(self, code_dir: str = "") -> str:
        """"train.py:42": the file relative to `code_dir` (the job's code as the worker sees it; the
        same on every node) when it is in there, else its basename (nodes have other absolute paths)."""
        root = code_dir.rstrip("/") + "/" if code_dir else ""
        name = self.file[len(root):] if root and self.file.startswith(root) else posixpath.basename(self.file)
        return f"{name}:{self.line}"


@dataclass(frozen=True)
class Traceback:
    """One traceback as read (bounded): what `TracebackReader` keeps of it.

    `frame_lines` are the deepest printed lines of its frames, after `frames_left_out` others;
    `user_frame` is its last frame in the user's code (is_user_file), `last_frame` its last frame;
    `exception` its exception line; `message` the next lines of the exception's message, after which
    `message_cut` lines were not kept, the last of them `message_last`.
    """

    exception: str
    header: bool = True
    frame_lines: tuple[str, ...] = ()
    frames_left_out: int = 0
    user_frame: Frame | None = None
    last_frame: Frame | None = None
    message: tuple[str, ...] = ()
    message_cut: int = 0
    message_last: str = ""

    @property
    def type(self) -> str:
        """The exception's type as printed: "ValueError", "tensorflow.python...ResourceExhaustedError"."""
        return self.exception.split(":", 1)[0].strip()

    @property
    def short_type(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    @property
    def first_line(self) -> str:
        """The message's first line (what follows "Type: " on the exception line)."""
        return self.exception.partition(":")[2].strip()

    @property
    def message_lines(self) -> int:
        """How many lines the whole message has, its first (on the exception line) included."""
        return 1 + len(self.message) + self.message_cut

    @property
    def frame(self) -> Frame | None:
        """Where it was raised, as far as the user can tell: the user's last frame, else the last one."""
        return self.user_frame or self.last_frame

    def place(self, code_dir: str = "") -> str:
        """"train.py:42" (see Frame.where); "" for a traceback without a frame."""
        return self.frame.where(code_dir) if self.frame else ""

    def key(self, code_dir: str = "") -> tuple[str, str]:
        """What makes two workers' errors the same: its type and place, never its message (which
        may hold values that differ between workers) nor absolute paths (which differ between nodes)."""
        return self.type, self.place(code_dir)

    @property
    def text(self) -> str:
        """The words kept of the exception: its line, its message's kept lines and last line."""
        return "\n".join((self.exception, *self.message, self.message_last))

    def head(self, frame_budget: int) -> list[str]:
        """The header, at most `frame_budget` lines of frames (the deepest, a line counting those left
        out, and the user's frame when it is higher up) and the exception line."""
        shown, above = list(self.frame_lines), []
        total = self.frames_left_out + len(shown)
        if total > frame_budget:
            keep = max(frame_budget - 1, 0)  # one line says how many were left out
            user = list(self.user_frame.lines) if self.user_frame else []
            tail = shown[-keep:] if keep else []
            if user and user[0] not in tail and len(user) < keep:
                above, tail = user, shown[-(keep - len(user)):]
            shown = tail
            above = [f"  ... ({total - len(shown) - len(above)} lines left out)", *above]
        return [*([TRACEBACK_HEADER] if self.header else []), *above, *shown, clip(self.exception)]

    def lines(self, limit: int, log_path: str = "") -> tuple[str, ...]:
        """The traceback as printed, bounded to about `limit` lines: head() and message_tail()."""
        tail = self.message_tail(log_path)
        return tuple(self.head(limit - int(self.header) - 1 - len(tail)) + tail)

    def message_tail(self, log_path: str = "") -> list[str]:
        """The message's kept lines after its first, a line counting those cut (`log_path`: where the
        whole text is), and its last line."""
        tail = list(self.message)
        if self.message_cut > 1:
            tail.append(cut_line(self.message_cut - 1, log_path))
        if self.message_cut:
            tail.append(self.message_last)
        return tail


def cut_line(count: int, log_path: str = "") -> str:
    """The line said in place of `count` lines of a message."""
    where = f" (whole in {log_path})" if log_path else ""
    return f"… {count} line{'s' * (count != 1)} cut{where}"


class TracebackReader:
    """Reads one worker's output lines in order (feed), keeping its last traceback (`last`).

    Bounded, whatever the worker prints: see the module docstring.
    """

    def __init__(self) -> None:
        self._done: Traceback | None = None  # the last traceback whose message is over
        self._current: Traceback | None = None  # one whose exception line came, its message going on
        self._state = TEXT  # TEXT, FRAME (reading frames) or MESSAGE
        self.released: tuple[str, ...] = ()  # see RELEASED; set with the START or RELEASED role
        self._begin(False)

    @property
    def last(self) -> Traceback | None:
        """The last traceback whose exception line came (with its message as far as read), or None;
        not torchrun's (ChildFailedError), which only says that the process's own came before it."""
        current = self._with_message() if self._current else None
        return current if current and current.type != _LAUNCHER_WRAPPER else self._done

    @property
    def current(self) -> Traceback | None:
        """The traceback whose message is being read (after the EXCEPTION role), else None."""
        return self._with_message() if self._current else None

    @property
    def in_frames(self) -> bool:
        """A traceback's frames are being read: its exception line has not come yet."""
        return self._state == FRAME

    def pending(self) -> tuple[str, ...]:
        """The lines of a traceback whose exception line has not come yet, bounded (empty when none)."""
        if self._state != FRAME:
            return ()
        left = [f"  ... ({self._left_out} lines left out)"] if self._left_out else []
        return (*([TRACEBACK_HEADER] if self._header else []), *left, *self._frames)

    def feed(self, line: str) -> str:
        """Read the next line; its role (TEXT, START, FRAME, EXCEPTION, MESSAGE, CHAIN, RELEASED)."""
        text = _RANK_PREFIX.sub("", line.rstrip("\r\n"))
        self.released = ()
        if self._state == FRAME:
            return self._in_frames(text)
        if self._state == MESSAGE:
            if _is_header(text):
                self.end()
                return self._start(True, text)
            if _CHAIN.match(text):
                self.end()
                return CHAIN
            if _OTHER_OUTPUT.match(text) or classify(text) is not None:
                self.end()
                return TEXT
            self._add_message(text)
            return MESSAGE
        if _is_header(text):
            return self._start(True, text)
        frame = _FRAME.match(text) if text[:1].isspace() else None
        if frame and frame["func"] is None:  # a SyntaxError in the main script prints no header
            return self._start(False, text)
        return TEXT

    def end(self) -> None:
        """The worker printed something else: a message being read is over (a held one is kept)."""
        if self._current:
            done = self._with_message()
            self._done = done if done.type != _LAUNCHER_WRAPPER else self._done
            self._current = None
        if self._state == MESSAGE:
            self._state = TEXT

    def reset(self) -> None:
        """A new log (the next generation): forget any traceback being read; `last` stays."""
        self.end()
        self._state = TEXT

    # -- frames ----------------------------------------------------------------------------------

    def _begin(self, header: bool) -> None:
        self._header = header
        self._frames: collections.deque[str] = collections.deque(maxlen=FRAME_LINES)
        self._left_out = 0
        self._frame: list[str] = []  # the frame being printed: its File line and the lines under it
        self._user: Frame | None = None
        self._last_frame: Frame | None = None
        self._strays = 0

    def _start(self, header: bool, text: str) -> str:
        self.released = self.pending()  # an unfinished traceback before it (shown as it was)
        self._begin(header)
        self._state = FRAME
        if not header:
            self._add_frame_line(text)
        return START

    def _in_frames(self, text: str) -> str:
        if _is_header(text):
            return self._start(True, text)
        if not text.strip() or text[:1].isspace():
            self._add_frame_line(text)
            return FRAME
        pattern = _EXCEPTION_LIKE if self._header else _EXCEPTION
        if pattern.match(text) and not _LOGGING.match(text):
            self._end_frames(text)
            return EXCEPTION
        self._strays += 1
        if self._header and self._strays <= MAX_STRAYS:
            return TEXT  # another thread's line among the frames (a TensorFlow log line)
        self.released, self._state = self.pending(), TEXT
        return RELEASED

    def _add_frame_line(self, text: str) -> None:
        if _FRAME.match(text):
            self._finish_frame()
            self._frame = [clip(text)]
        elif self._frame and len(self._frame) <= SOURCE_LINES:
            self._frame.append(clip(text))
        if len(self._frames) == self._frames.maxlen:
            self._left_out += 1
        self._frames.append(clip(text))

    def _finish_frame(self) -> None:
        if not self._frame:
            return
        match = _FRAME.match(self._frame[0])
        frame = Frame(match["file"], int(match["line"]), tuple(self._frame))
        self._last_frame = frame
        if is_user_file(frame.file):
            self._user = frame
        self._frame = []

    def _end_frames(self, exception: str) -> None:
        self._finish_frame()
        self._current = Traceback(clip(exception.strip()), self._header, tuple(self._frames), self._left_out,
                                  self._user, self._last_frame)
        self._message: list[str] = []
        self._cut, self._message_last = 0, ""
        self._state = MESSAGE

    # -- message ---------------------------------------------------------------------------------

    def _add_message(self, text: str) -> None:
        if len(self._message) < MESSAGE_LINES:
            self._message.append(clip(text))
        else:
            self._cut += 1
            self._message_last = clip(text)

    def _with_message(self) -> Traceback:
        return replace(self._current, message=tuple(self._message), message_cut=self._cut,
                       message_last=self._message_last)


def read_traceback(lines) -> Traceback | None:
    """The last traceback in `lines` (read as TracebackReader reads them), or None."""
    reader = TracebackReader()
    for line in lines:
        reader.feed(line)
    return reader.last
