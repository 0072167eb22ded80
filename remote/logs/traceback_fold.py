"""A run's tracebacks folded for a person, line by line as the workers' lines stream in.

Every worker of a run that a script error stops prints the same traceback, and its message can be
hundreds of lines (Keras 3 under MultiWorkerMirroredStrategy dumps a tensor per replica). A front
end (`run --no-tui`, the TUI's log panel, the report) shows each traceback once and bounded: its
frames (the deepest, and the user's), its exception line and the first lines of its message; the
rest is said in one line, "… N lines cut (whole in experiments/RUN-ID/logs/WORKER.log)", followed by
the message's last line, and the fix where the cause is known (known_causes.py). Another worker's
traceback of the same type raised at the same place is said in one line. This changes only what is
shown: the log files keep every line.

A traceback's lines are held from its header to its exception line (printed together, at once),
since only then is it known whether it repeats another. Where its message ends is not printed: the
front end says so with `end` (a metric line came from that worker), `pause` (before a line of its
own: what was cut so far is counted) and `finish` (the generation's logs are read to their end).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Callable

from homegpu.remote.logs.known_causes import known_cause
from homegpu.remote.logs.tracebacks import (
    CHAIN, EXCEPTION, FRAME, MESSAGE, MESSAGE_LINES, RELEASED, START, TEXT, Traceback, TracebackReader, clip, cut_line,
)

FRAME_BUDGET = 16  # printed lines of a traceback's frames shown

_PLAIN, _HELD, _SHOWN, _SAME = "plain", "held", "shown", "same"  # a worker's state in the fold


class _Worker:
    def __init__(self) -> None:
        self.reader = TracebackReader()
        self.state = _PLAIN
        self.traceback: Traceback | None = None  # the one shown, from its exception line on
        self.shown = 0  # message lines shown after the exception line
        self.cut = 0  # message lines not shown since the last count said
        self.last = ""  # the last of them
        self.hinted = False  # its known cause was said
        self.chained_same = False  # a repeated traceback's chain goes on: its next one may repeat too
        self.said: set[tuple[str, str]] = set()  # the (type, place) of each traceback it showed


class TracebackFold:
    """Folds the tracebacks of one run's workers (see the module docstring).

    Args:
        log_path: worker -> where its whole log is, as the user should read it.
    """

    def __init__(self, log_path: Callable[[str], str] | None = None) -> None:
        self.log_path = log_path or (lambda worker: f"logs/{worker}.log")
        self._workers: dict[str, _Worker] = {}
        self._shown: dict[tuple[str, str], str] = {}  # (type, place) -> the worker whose traceback showed it

    def feed(self, worker: str, text: str) -> list[str]:
        """The lines to show for `worker`'s next line `text` (none while a traceback is held)."""
        state = self._workers.setdefault(worker, _Worker())
        role = state.reader.feed(text)
        if role == START:
            return self._close(worker, state) + list(state.reader.released) + self._hold(state)
        if role == FRAME:
            return []
        if role == EXCEPTION:
            return self._exception(worker, state)
        if role == MESSAGE:
            return self._message(state, text)
        if role == CHAIN:
            if state.state == _SAME:
                state.chained_same = True
                return []
            return self._close(worker, state) + [text]
        if role == RELEASED:
            state.state = _PLAIN
            return list(state.reader.released) + [text]
        if state.reader.in_frames:  # another thread's line among the frames being held
            return [text]
        if role == TEXT and state.chained_same and not text.strip():
            return []  # the blank lines of a repeated chain
        state.chained_same = False
        return self._close(worker, state) + [text]

    def end(self, worker: str) -> list[str]:
        """`worker` printed a line that is not shown as text (a metric line): its message is over."""
        state = self._workers.get(worker)
        if state is None:
            return []
        state.reader.end()
        return self._close(worker, state)

    def pause(self) -> list[tuple[str, str]]:
        """(worker, line) for what each worker's open message has cut so far, before a line that is
        not a worker's (a state change); later lines of the message are counted afresh."""
        return [(worker, line) for worker, state in self._workers.items()
                for line in self._count(worker, state)]

    def finish(self) -> list[tuple[str, str]]:
        """(worker, line) for everything still held or uncounted: the logs were read to their end."""
        lines = []
        for worker, state in self._workers.items():
            held = list(state.reader.pending())
            state.reader.reset()
            lines += [(worker, line) for line in [*held, *self._close(worker, state)]]
            state.state, state.chained_same = _PLAIN, False
        return lines

    def reset(self) -> None:
        """Another run: nothing of this one is held or said to repeat."""
        self._workers.clear()
        self._shown.clear()

    # -- a worker's traceback -------------------------------------------------------------------------

    def _hold(self, state: _Worker) -> list[str]:
        state.state = _HELD  # until its exception line: whether it repeats another is not known yet
        return []

    def _exception(self, worker: str, state: _Worker) -> list[str]:
        traceback = state.reader.current
        first = self._shown.setdefault(traceback.key(), worker)
        state.traceback, state.shown, state.cut, state.last, state.hinted = traceback, 0, 0, "", False
        chained, state.chained_same = state.chained_same, False
        if first == worker and traceback.key() not in state.said:
            state.said.add(traceback.key())
            state.state = _SHOWN
            return traceback.head(FRAME_BUDGET)
        state.state = _SAME
        if chained:
            return []  # the chain it ends was said to repeat already
        place = f" at {traceback.place()}" if traceback.place() else ""
        whom = "before" if first == worker else first
        return [f"the same {traceback.short_type}{place} as {whom} (whole in {self.log_path(worker)})"]

    def _message(self, state: _Worker, text: str) -> list[str]:
        if state.state != _SHOWN:
            return []
        if state.shown < MESSAGE_LINES:
            state.shown += 1
            return [clip(text)]
        state.cut += 1
        state.last = text
        return []

    def _count(self, worker: str, state: _Worker) -> list[str]:
        """The cut lines so far and the last of them, and the known cause (once)."""
        if state.state != _SHOWN:
            return []
        lines = []
        if state.cut > 1:
            lines.append(cut_line(state.cut - 1, self.log_path(worker)))
        if state.cut:
            lines.append(clip(state.last))
        state.cut = 0
        traceback = state.reader.last or state.traceback
        cause = known_cause(traceback.exception, traceback.text) if not state.hinted else None
        if cause is not None:
            state.hinted = True
            lines.append(f"↳ {cause.words}")
        return lines

    def _close(self, worker: str, state: _Worker) -> list[str]:
        """The traceback shown is over: its counts, and the worker's lines are plain again."""
        lines = self._count(worker, state)
        if state.state in (_SHOWN, _SAME):
            state.state = _PLAIN
        return lines
