"""Script errors versus faults: whether a failed run is worth restarting, and what to show.

A script that fails before it trained anything, with the same error on every worker (an import
that fails, a typo, a bad path in its own code, Keras 3 under MultiWorkerMirroredStrategy), fails
the same way on every restart: restarting only repeats its traceback. That is a script error: said
once, not retried. "The same error" is the same exception type raised at the same place in the
user's code (its last frame there, by its path in the job's code); never the message, which can be
hundreds of lines holding values that differ between workers. Everything else is a fault that a
restart can cure: a signal, a vanished worker or lost node, a stall, a failure after training began
(a peer died, out of memory), or errors that differ between workers. A fault that is the script's all the same
(it raises at epoch 3 every time) shows as the same error ending two generations in a row: repeatable_errors gives
what one generation is compared with the next by (run_restarts.py).

Pure: the caller (the run's watch loop) gathers each worker's end: its last traceback, read as its
lines arrived (remote/logs/tracebacks.py, so a header far above the log's end is not lost), and its
last log lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from homegpu.remote.events import Metric
from homegpu.remote.logs import (
    ScriptProgress, Traceback, classify, clip, is_supervisor_note, known_cause, out_of_memory, read_traceback,
)

TAIL_LINES = 30  # at most this many lines of a traceback are shown
HEAD_CHARS = 120  # of an error's first line in a one-line summary
NAMED_WORKERS = 8  # workers named in a summary; more are counted
# Keras' progress bar after a finished step: "12/40 [===>....]" (tf-keras) or "12/40 ━━━━" (Keras 3).
_KERAS_STEP = re.compile(r"^\s*\d+/(?:\d+|Unknown)\s+(?:\[|━)")
_SIGNAL_STATUSES = range(129, 160)  # 128 + signal number, as shells and containers report a kill


@dataclass(frozen=True)
class ErrorTail:
    """The end of a worker's last traceback: `lines` as printed (at most about TAIL_LINES, its
    message cut), and its exception line, e.g. "ModuleNotFoundError: No module named 'foo'" ("" when none)."""

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
        traceback: its last traceback, read as its lines arrived (however far above its last lines
            its header is); None: looked for in `last_lines`.
        code_dir: the job's code as the worker sees it, to name where its error was raised
            the same way on every node.
    """

    label: str
    exit_status: int | None
    progressed: bool = False
    last_lines: tuple[str, ...] = ()
    stalled: bool = False
    stopped: bool = False
    traceback: Traceback | None = None
    code_dir: str = ""


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

    A traceback runs from its "Traceback (most recent call last):" (a SyntaxError in the main script
    prints none: its indented `File "..."` line) to its exception line and that exception's message.
    Longer ones keep their header, their deepest frames with a line saying how many were left out,
    their exception line and the first lines of the message with a count of the rest.
    """
    traceback = read_traceback(lines)
    return ErrorTail(traceback.lines(limit), traceback.exception) if traceback else ErrorTail()


def shows_progress(line: str) -> bool:
    """Whether a log line proves that training ran: a step/epoch/end metric line, a Keras progress bar
    after a step, or a script's own epoch line with a loss or step (script_progress.py). ("Epoch 1/3" alone
    does not: Keras prints it before the first step.)"""
    metric = classify(line)
    if metric is not None:
        return metric.progressed
    last = line.rsplit("\r", 1)[-1]
    own = ScriptProgress().feed(last)
    return bool(_KERAS_STEP.match(last) or (own and Metric(own).progressed))


def might_be_script_error(end: WorkerEnd) -> bool:
    """Whether this worker's end could be part of a script error (it exited by itself with an
    error before any progress). The caller then lets the other workers end by themselves, for a
    while, before stopping them: a script error needs every worker's own end to be recognised."""
    return _failed_by_itself(end) and not end.progressed


def judge(ends: Sequence[WorkerEnd]) -> Verdict:
    """Script error or fault, from every worker's end in the failed generation.

    Returns:
        Verdict(script_error=True) when every worker failed by itself before any progress with
        the same error (the same exception type raised at the same place in the user's code, or
        with no traceback the same exit status and last line); its summary names the error, its
        first line, where it was raised and the fix when the cause is known (known_causes), and its
        tail is the first worker's traceback. Any other failure is a fault (retry), with a summary
        naming its cause.
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
                              + "; ".join(f"{end.label}: {_last_line(end)}" for end in ends[:NAMED_WORKERS]))
    first = ends[0]
    traceback = _traceback(first)
    return Verdict(True, script_error_summary(ends, traceback),
                   traceback.lines(TAIL_LINES) if traceback else ())


def repeatable_errors(ends: Sequence[WorkerEnd]) -> dict[tuple, str]:
    """A failed generation's errors, to compare with the next one's: (worker, type, place in the user's code) ->
    "worker: Type: its first line at train.py:42" for each worker that failed by itself with a traceback. {} where
    the generation proves nothing of the script: a worker killed, vanished or stalled, or one that failed without
    a traceback of its own (torchrun's when its process was killed), since the cause was outside the script."""
    errors = {}
    for end in ends:
        if end.stopped or end.exit_status == 0:
            continue
        traceback = _traceback(end)
        if not _failed_by_itself(end) or traceback is None:
            return {}
        place = traceback.place(end.code_dir)
        errors[(end.label, *traceback.key(end.code_dir))] = f"{end.label}: {_last_line(end)}" + (
            f" at {place}" if place else "")
    return errors


def ran_out_of_memory(ends: Sequence[WorkerEnd]) -> bool:
    """Whether a worker of a failed generation ended by its GPU running out of memory (its traceback, else its last
    lines say so)."""
    for end in ends:
        if end.stopped or end.exit_status == 0:
            continue
        traceback = _traceback(end)
        exception = traceback.exception if traceback else _last_line(end)
        if out_of_memory(exception, "\n".join((traceback.text if traceback else "", *end.last_lines))):
            return True
    return False


def script_error_summary(ends: Sequence[WorkerEnd], traceback: Traceback | None) -> str:
    """One line: which workers, the error and its first line, where, the exit status, the fix."""
    first = ends[0]
    if traceback:
        words = _head(traceback) + (f" at {place}" if (place := traceback.place(first.code_dir)) else "")
        cause = known_cause(traceback.exception, "\n".join((traceback.text, *first.last_lines)))
    else:
        words = _last_line(first)
        cause = known_cause(words, "\n".join(first.last_lines))
    line = (f"script error on every worker ({_labels(ends)}) before training started: {words} "
            f"(exit {first.exit_status}; not restarted")
    return line + (f") — known cause: {cause.words}" if cause else ": fix the script and run again)")


def _head(traceback: Traceback) -> str:
    """"ValueError: Attempt to convert a value (PerReplica:{ …": its type and first line, "…" when
    the message goes on or was cut here."""
    first = traceback.first_line
    head = f"{traceback.short_type}: {clip(first, HEAD_CHARS)}" if first else traceback.short_type
    return head + " …" if traceback.message_lines > 1 and not head.endswith("…") else head


def _labels(ends: Sequence[WorkerEnd]) -> str:
    labels = ", ".join(end.label for end in ends[:NAMED_WORKERS])
    return labels + (f" and {len(ends) - NAMED_WORKERS} more" if len(ends) > NAMED_WORKERS else "")


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


def _traceback(end: WorkerEnd) -> Traceback | None:
    return end.traceback or read_traceback(end.last_lines)


def _error_key(end: WorkerEnd) -> tuple:
    """What makes two workers' errors "the same": the type and where in the user's code it was
    raised (Traceback.key), not the message nor per-node paths."""
    traceback = _traceback(end)
    if traceback:
        return ("traceback", *traceback.key(end.code_dir))
    return ("exit", end.exit_status, _last_line(end))


def _last_line(end: WorkerEnd) -> str:
    """The error's exception line, else the worker's last non-blank log line of its own (bounded)."""
    traceback = _traceback(end)
    if traceback:
        return clip(traceback.exception, HEAD_CHARS)
    for line in reversed(end.last_lines):
        if line.strip() and not is_supervisor_note(line):
            return clip(line.strip(), HEAD_CHARS)
    return f"exit {end.exit_status}, no output"
