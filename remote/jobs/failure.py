"""Script errors versus faults: whether a failed run is worth restarting, and what to show.

A script that fails before it trained anything, with the same error on every worker (an import
that fails, a typo, a bad path in its own code), fails the same way on every restart: restarting
only repeats its traceback. That is a script error: shown once, not retried. Everything else is a
fault that a restart can cure: a signal, a vanished worker or lost node, a stall, a failure after
training began (a peer died, out of memory), or errors that differ between workers.

Pure: the caller (the run's watch loop) gathers each worker's end and last log lines.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Sequence

from homegpu.remote.logs import classify

TRACEBACK_HEADER = "Traceback (most recent call last):"
TAIL_LINES = 30  # at most this many lines of a traceback are shown

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?$')
# The final line of a traceback printed without a header (a SyntaxError in the main script).
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
# Keras' progress bar after a finished step: "12/40 [===>....]" (tf-keras) or "12/40 ━━━━" (Keras 3).
_KERAS_STEP = re.compile(r"^\s*\d+/(?:\d+|Unknown)\s+(?:\[|━)")
_SIGNAL_STATUSES = range(129, 160)  # 128 + signal number, as shells and containers report a kill


@dataclass(frozen=True)
class ErrorTail:
    """The end of a worker's last traceback: `lines` as printed (at most TAIL_LINES), and its
    final `exception` line, e.g. "ModuleNotFoundError: No module named 'foo'" ("" when none)."""

    lines: tuple[str, ...] = ()
    exception: str = ""


@dataclass(frozen=True)
class WorkerEnd:
    """How one worker of a failed generation ended.

    Args:
        label: the worker's name in messages, e.g. "n0".
        exit_status: its exit status; negative for a signal; None when it vanished or its node
            was lost (no status could be read).
        progressed: whether it trained at all: a step, epoch or end metric line, or a Keras
            step (see shows_progress).
        last_lines: its last log lines, oldest first.
        stalled: the controller stopped it for printing nothing for too long.
        stopped: the controller stopped it (a peer failed first), so its end says nothing.
    """

    label: str
    exit_status: int | None
    progressed: bool = False
    last_lines: tuple[str, ...] = ()
    stalled: bool = False
    stopped: bool = False


@dataclass(frozen=True)
class Verdict:
    """A failed generation judged: `script_error` (do not restart) or a fault (restart).

    `summary` is one line for the run's end; `tail` the traceback to show once (script errors).
    """

    script_error: bool
    summary: str
    tail: tuple[str, ...] = ()

    @property
    def retry(self) -> bool:
        return not self.script_error


def error_tail(lines: Sequence[str], limit: int = TAIL_LINES) -> ErrorTail:
    """The last traceback in `lines` and its exception line; ErrorTail() when there is none.

    The block runs from the last "Traceback (most recent call last):" to the first unindented
    line after it (the exception). A SyntaxError in the main script prints no header: its block is
    the indented `File "..."` lines above its exception line. Longer blocks keep their header and
    their last lines, with a line saying how many were left out.
    """
    lines = [line.rstrip("\r\n") for line in lines]
    block = _last_block(lines)
    if not block:
        return ErrorTail()
    exception = block[-1].strip()
    if len(block) > limit:
        kept = block[-(limit - 2):]
        block = [block[0], f"  ... ({len(block) - len(kept) - 1} lines left out)", *kept]
    return ErrorTail(tuple(block), exception)


def _last_block(lines: list[str]) -> list[str]:
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].strip() == TRACEBACK_HEADER:
            for end in range(start + 1, len(lines)):
                if lines[end].strip() and not lines[end][0].isspace():
                    return lines[start:end + 1]
            return []  # cut off before its exception line
    for end in range(len(lines) - 1, -1, -1):
        if _EXCEPTION.match(lines[end]):
            start = end
            while start > 0 and lines[start - 1][:1].isspace():
                start -= 1
            if start < end and _FRAME.match(lines[start]):
                return lines[start:end + 1]
    return []


def shows_progress(line: str) -> bool:
    """Whether a log line proves that training ran: a step/epoch/end metric line, or a Keras
    progress bar after a step. ("Epoch 1/3" alone does not: Keras prints it before the first step.)"""
    metric = classify(line)
    if metric is not None:
        return metric.progressed
    return bool(_KERAS_STEP.match(line.rsplit("\r", 1)[-1]))


def might_be_script_error(end: WorkerEnd) -> bool:
    """Whether this worker's end could be part of a script error (it exited by itself with an
    error before any progress). The caller then lets the other workers end by themselves, for a
    while, before stopping them: a script error needs every worker's own end to be recognised."""
    return _failed_by_itself(end) and not end.progressed


def judge(ends: Sequence[WorkerEnd]) -> Verdict:
    """Script error or fault, from every worker's end in the failed generation.

    Returns:
        Verdict(script_error=True) when every worker failed by itself before any progress with
        the same error (same exception type raised at the same place, or with no traceback the
        same exit status and last line); its summary quotes the error's last line and its tail is
        the first worker's traceback. Any other failure is a fault (retry), with a summary naming
        its cause.
    """
    failed = [end for end in ends if end.exit_status != 0]
    if not failed:
        return Verdict(False, "no worker failed")
    fault = _fault_reason(ends)
    if fault:
        return Verdict(False, fault)
    keys = {_error_key(end) for end in ends}
    if len(keys) > 1:
        return Verdict(False, "the workers failed with different errors before training: "
                              + "; ".join(f"{end.label}: {_last_line(end)}" for end in ends))
    first = ends[0]
    tail = error_tail(first.last_lines)
    labels = ", ".join(end.label for end in ends)
    return Verdict(True, f"script error on every worker ({labels}) before training started: "
                         f"{_last_line(first)} (exit {first.exit_status}; not restarted: "
                         f"fix the script and run again)", tail.lines)


def _fault_reason(ends: Sequence[WorkerEnd]) -> str:
    """Why this is a fault worth a restart, or "" when it may still be a script error."""
    for end in ends:
        if end.stalled:
            return f"{end.label} stalled"
        if end.exit_status is None:
            return f"{end.label} vanished (its node was lost, or it was killed with its supervisor)"
        if end.progressed and end.exit_status != 0:
            return f"{end.label} failed after training began: {_last_line(end)}"
    for end in ends:
        if end.stopped or not _failed_by_itself(end):
            return f"{end.label} {'was stopped' if end.stopped else _signal_words(end.exit_status)}"
    return ""


def _failed_by_itself(end: WorkerEnd) -> bool:
    status = end.exit_status
    return (status is not None and status > 0 and status not in _SIGNAL_STATUSES
            and not end.stalled and not end.stopped)


def _signal_words(status: int | None) -> str:
    if status == 0:
        return "succeeded while another worker failed"
    if status is not None and status < 0:
        return f"was killed by signal {-status}"
    if status in _SIGNAL_STATUSES:
        return f"was killed (exit {status}: signal {status - 128})"
    return f"ended with exit {status}"


def _error_key(end: WorkerEnd) -> tuple:
    """What makes two workers' errors "the same": where it was raised, not per-node paths."""
    tail = error_tail(end.last_lines)
    if tail.exception:
        frames = [m for m in map(_FRAME.match, tail.lines) if m]
        where = (posixpath.basename(frames[-1]["file"]), frames[-1]["line"]) if frames else ()
        return ("traceback", tail.exception.split(":", 1)[0], where)
    return ("exit", end.exit_status, _last_line(end))


def _last_line(end: WorkerEnd) -> str:
    """The error's exception line, else the worker's last non-blank log line."""
    tail = error_tail(end.last_lines)
    if tail.exception:
        return tail.exception
    for line in reversed(end.last_lines):
        if line.strip():
            return line.strip()
    return f"exit {end.exit_status}, no output"
