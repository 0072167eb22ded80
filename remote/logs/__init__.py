"""homegpu.remote.logs: a worker's output followed on its node across reconnects, turned into the lines a terminal
would show, each classified once (a typed Metric, Keras's progress, a notice, text); its tracebacks read and folded.
"""

from __future__ import annotations

from homegpu.remote.logs.classify import classify
from homegpu.remote.logs.known_causes import KnownCause, known_cause, out_of_memory
from homegpu.remote.logs.script_progress import EpochNumbers, ScriptProgress
from homegpu.remote.logs.tail import LogTail
from homegpu.remote.logs.tf_notices import is_harmless_tf_notice
from homegpu.remote.logs.traceback_fold import TracebackFold
from homegpu.remote.logs.tracebacks import (
    TRACEBACK_HEADER, Traceback, TracebackReader, clip, is_supervisor_note, read_traceback,
)

__all__ = [
    "TRACEBACK_HEADER", "EpochNumbers", "KnownCause", "LogTail", "ScriptProgress", "Traceback", "TracebackFold",
    "TracebackReader", "classify", "clip", "is_harmless_tf_notice", "is_supervisor_note", "known_cause",
    "out_of_memory", "read_traceback",
]
