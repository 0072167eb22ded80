"""A metric a worker reported, as one typed value, and the event that publishes it once.

A metric line (the HOMEGPU_METRIC protocol, trainer/PROTOCOL.md) or Keras's own progress output
becomes a Metric where its line is read (logs/classify.py). A run publishes it once, as a
WorkerMetric on the hub; the job panel, the progress lines, the timeline, the alerts, the straggler
check and the summary read its figures through the properties here, so the line's keys are spelled
in this module only. `fields` keeps everything the line said, for metrics.jsonl.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping

PROGRESS_EVENTS = frozenset({"step", "epoch", "end"})  # lines that prove training ran
FIGURES = ("loss", "accuracy", "val_loss", "val_accuracy")
# What Keras calls an accuracy in its output, after the metric compiled: metrics=["accuracy"] or a metric object.
ACCURACY_NAMES = ("accuracy", "acc", "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy")
RATE_UNITS = {"examples_per_sec": "examples/s", "steps_per_sec": "steps/s"}  # a worker's pace, best first


@dataclass(frozen=True)
class Metric:
    """What one metric line said; a figure the line did not carry (or carried as a non-number) is None."""

    fields: Mapping[str, Any]

    @property
    def event(self) -> str:
        """"start", "step", "epoch", "end", "error", "saving", "evaluate", …"""
        return str(self.fields.get("event", ""))

    @property
    def progressed(self) -> bool:
        """Whether this line proves that training ran (a step, an epoch, the end)."""
        return self.event in PROGRESS_EVENTS

    def number(self, key: str) -> float | None:
        value = self.fields.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def count(self, key: str) -> int | None:
        value = self.fields.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    rank = property(lambda self: self.count("worker"))  # the worker's rank (PROTOCOL.md), where its line says it
    workers = property(lambda self: self.count("workers"))
    epoch = property(lambda self: self.count("epoch"))
    epochs = property(lambda self: self.count("epochs"))
    step = property(lambda self: self.count("step"))
    steps_per_epoch = property(lambda self: self.count("steps_per_epoch"))
    initial_epoch = property(lambda self: self.count("initial_epoch"))
    params = property(lambda self: self.count("params"))
    batch_size = property(lambda self: self.count("batch_size"))
    loss = property(lambda self: self.number("loss"))
    accuracy = property(lambda self: self._accuracy(""))
    val_loss = property(lambda self: self.number("val_loss"))
    val_accuracy = property(lambda self: self._accuracy("val_"))
    examples_per_sec = property(lambda self: self.number("examples_per_sec"))
    steps_per_sec = property(lambda self: self.number("steps_per_sec"))
    # a balanced run's step of this worker in parts (trainer/shares.py step_parts)
    step_seconds = property(lambda self: self.number("step_seconds"))
    compute_seconds = property(lambda self: self.number("compute_seconds"))
    overhead_seconds = property(lambda self: self.number("overhead_seconds"))
    wait_seconds = property(lambda self: self.number("wait_seconds"))
    compute_examples_per_sec = property(lambda self: self.number("compute_examples_per_sec"))

    @property
    def shares(self) -> tuple[int, ...] | None:
        """A balanced run's shares of a step, per replica or process (trainer/shares.py), or None."""
        value = self.fields.get("shares")
        if isinstance(value, list) and value and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                     for n in value):
            return tuple(value)
        return None

    @property
    def message(self) -> str:
        """An "error" line's message."""
        return str(self.fields.get("message", ""))

    @property
    def has_validation(self) -> bool:
        return "val_loss" in self.fields

    def _accuracy(self, prefix: str) -> float | None:
        """The accuracy under whichever name the script compiled it (Keras names it after the metric)."""
        return next((value for name in ACCURACY_NAMES if (value := self.number(prefix + name)) is not None), None)

    def figures(self) -> dict[str, float | None]:
        """loss and accuracy, then the val_ figures when the line has them."""
        figures = {name: getattr(self, name) for name in FIGURES}
        return {name: value for name, value in figures.items() if name in ("loss", "accuracy") or value is not None}

    def rate(self) -> tuple[float | None, str]:
        """examples/s, else steps/s (Keras's output of a script whose batch size homegpu does not know)."""
        if self.examples_per_sec is not None or "steps_per_sec" not in self.fields:
            return self.examples_per_sec, RATE_UNITS["examples_per_sec"]
        return self.steps_per_sec, RATE_UNITS["steps_per_sec"]

    def merged(self, newer: Metric) -> Metric:
        """This metric with `newer`'s fields on top: a worker's latest figure of each kind."""
        return Metric({**self.fields, **newer.fields})


NO_METRIC = Metric({})


@dataclass(frozen=True)
class WorkerMetric:
    """The hub's event for a metric line of a run's worker (its LogLine is not published too)."""

    job: str
    run_id: str
    worker: str
    index: int
    metric: Metric
    at: float = field(default_factory=time.time)
