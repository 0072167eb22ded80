"""A line of a followed log, as the hub carries it (logs/tail.py follows the log)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from homegpu.remote.events.metric import Metric


@dataclass(frozen=True)
class LogLine:
    """One line of a followed log; `seq` counts lines of that log from 1, across reconnects.

    `worker` names the job's worker the log belongs to (several may share a node), else the node.
    `metric` is what the line reports when it is a metric line (logs/classify.py), else None: a
    run publishes those as WorkerMetric events, not as log text.
    """

    node: str
    source: str
    seq: int
    text: str
    worker: str = ""
    at: float = field(default_factory=time.time)
    metric: Metric | None = field(default=None, compare=False)
