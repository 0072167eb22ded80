"""What a worker's output line is: a metric (events/metric.py) or plain log text. Classified once,
where the line is read (LogTail), and carried on its LogLine.

Three kinds of metric lines, best first: the HOMEGPU_METRIC protocol (trainer/PROTOCOL.md), Keras's own
progress output (remote/logs/keras_progress.py), which any unmodified Keras script prints, and the epoch
lines and tqdm bars other scripts print (remote/logs/script_progress.py). Each is read only from a log that
has shown none of a better kind, so a script printing two is not counted twice.
"""

from __future__ import annotations

from homegpu.remote.events import Metric
from homegpu.remote.logs.keras_progress import KerasProgress
from homegpu.remote.logs.script_progress import EpochNumbers, ScriptProgress
from homegpu.trainer.metrics import parse_metric_line


def classify(text: str) -> Metric | None:
    """The protocol metric `text` carries, or None (stateless: Keras lines need a LineClassifier)."""
    fields = parse_metric_line(text)
    return Metric(fields) if fields is not None else None


class LineClassifier:
    """Classifies the lines of one log, in order (Keras's epoch summary needs its `Epoch N/M` line).

    Args:
        batch_size: the worker's batch size, when known, for Keras's examples/s.
        epoch_numbers: how the worker's script numbers its epochs, as its run's earlier generations told it.
    """

    def __init__(self, batch_size: int | None = None, epoch_numbers: EpochNumbers | None = None) -> None:
        self._keras: KerasProgress | None = KerasProgress(batch_size)
        self._script: ScriptProgress | None = ScriptProgress(epoch_numbers)

    def classify(self, text: str) -> Metric | None:
        """The metric `text` carries, or None for a plain log line."""
        metric = classify(text)
        if metric is not None:
            self._keras = self._script = None  # the script speaks the protocol: the rest is log text
            return metric
        keras = self._keras.feed(text) if self._keras else None
        if keras is not None and keras["event"] != "start":
            self._script = None  # Keras's bars: its `Epoch N/M` lines are its headers, read above
        script = self._script.feed(text) if self._script else None
        fields = keras or script
        return Metric(fields) if fields is not None else None
