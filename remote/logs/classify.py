"""What a worker's output line is: a metric (logs/metric.py) or plain log text. Classified once,
where the line is read (LogTail), and carried on its LogLine.

Two kinds of metric lines: the HOMEGPU_METRIC protocol (trainer/PROTOCOL.md), and Keras's own
progress output (remote/logs/keras_progress.py), which any unmodified script prints. Keras's lines are
read only from a log that has shown no protocol line, so a script printing both is not counted twice.
"""

from __future__ import annotations

from homegpu.remote.logs.keras_progress import KerasProgress
from homegpu.remote.logs.metric import Metric
from homegpu.trainer.metrics import parse_metric_line


def classify(text: str) -> Metric | None:
    """The protocol metric `text` carries, or None (stateless: Keras lines need a LineClassifier)."""
    fields = parse_metric_line(text)
    return Metric(fields) if fields is not None else None


class LineClassifier:
    """Classifies the lines of one log, in order (Keras's epoch summary needs its `Epoch N/M` line).

    Args:
        batch_size: the worker's batch size, when known, for Keras's examples/s.
    """

    def __init__(self, batch_size: int | None = None) -> None:
        self._keras: KerasProgress | None = KerasProgress(batch_size)

    def classify(self, text: str) -> Metric | None:
        """The metric `text` carries, or None for a plain log line."""
        metric = classify(text)
        if metric is not None:
            self._keras = None  # the script speaks the protocol: its Keras bars are log text
            return metric
        fields = self._keras.feed(text) if self._keras else None
        return Metric(fields) if fields is not None else None
