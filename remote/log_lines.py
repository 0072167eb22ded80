"""What a worker's output line is: a metric (a dict the job panel and the experiment log take) or
plain log text. Classified once, where the line is read (LogTail), and carried on its LogLine.

A new kind of metric line (say, Keras's own progress output) is one more parser in PARSERS.
"""

from __future__ import annotations

from typing import Callable

from homegpu.trainer.metrics import parse_metric_line

# Each parser takes a line's text and returns its metric dict, or None when the line is not its kind.
PARSERS: tuple[Callable[[str], dict | None], ...] = (parse_metric_line,)


def classify(text: str) -> dict | None:
    """The metric `text` carries, or None for a plain log line.

    Returns:
        The first parser's dict (with a string "event" key), else None.
    """
    for parse in PARSERS:
        metric = parse(text)
        if metric is not None:
            return metric
    return None
