"""homegpu.remote.logs: a worker's output followed on its node across reconnects, turned into the lines a
terminal would show, each classified once (a typed Metric, Keras's progress, a harmless notice, text).
"""

from __future__ import annotations

from homegpu.remote.logs.classify import classify
from homegpu.remote.logs.metric import NO_METRIC, RATE_UNITS, Metric, WorkerMetric
from homegpu.remote.logs.tail import LogLine, LogTail
from homegpu.remote.logs.tf_notices import is_harmless_tf_notice

__all__ = [
    "NO_METRIC", "RATE_UNITS", "LogLine", "LogTail", "Metric", "WorkerMetric", "classify", "is_harmless_tf_notice",
]
