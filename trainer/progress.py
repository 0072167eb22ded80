"""The callback that prints metric lines (PROTOCOL.md): start, steps, epochs, end.

Loss and accuracy are global (over all workers' examples), so every worker prints the same values.
`examples_per_sec` is this worker's own rate (local batch × steps / seconds of training), so a
slow machine stands out.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import tf_keras as keras

from homegpu.trainer.cluster import WorkerRole
from homegpu.trainer.metrics import format_metric

EPOCH_KEYS = ("loss", "accuracy", "val_loss", "val_accuracy")


def emit(role: WorkerRole, **fields: Any) -> None:
    """Print one metric line for this worker and flush, so a log tail sees it at once."""
    print(format_metric(worker=role.rank, workers=role.workers, time=round(time.time(), 3), **fields),
          flush=True)


class MetricLines(keras.callbacks.Callback):
    """Prints the start, step and epoch lines during fit(); `finish()` prints the end line.

    Args:
        role: this worker's place in the job.
        epochs: the total number of epochs fit() was asked for.
        local_batch: this worker's batch size.
        log_every: a step line every this many steps (0: none).
        start_fields: extra fields for the start line (data, model, batch sizes ...).
        resume_epoch: returns the epoch fit() resumes at; called when training begins, after
            the backup callback (earlier in the callback list) restored its state.
    """

    def __init__(self, role: WorkerRole, *, epochs: int, local_batch: int, log_every: int,
                 start_fields: dict, resume_epoch: Callable[[], int]) -> None:
        super().__init__()
        self._supports_tf_logs = True  # batch logs stay tensors; read only on the steps we print
        self.role, self.epochs, self.local_batch, self.log_every = role, epochs, local_batch, log_every
        self.start_fields, self.resume_epoch = start_fields, resume_epoch
        self.initial_epoch = 0
        self._train_start = self._epoch_start = self._window_start = time.monotonic()
        self._train_end = self._train_start
        self._epoch = self._epoch_steps = self._window_steps = 0
        self.last: dict = {}
        self.epoch_fields: Callable[[], dict] = dict  # more fields of each epoch line (a balanced run's shares)

    def on_train_begin(self, logs=None):
        self.initial_epoch = self.resume_epoch()
        self._train_start = time.monotonic()
        emit(self.role, event="start", initial_epoch=self.initial_epoch, resumed=self.initial_epoch > 0,
             epochs=self.epochs, **self.start_fields)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_start = self._window_start = self._train_end = time.monotonic()
        self._epoch_steps = self._window_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._train_end = time.monotonic()
        self._epoch_steps += 1
        self._window_steps += 1
        if self.log_every and self._epoch_steps % self.log_every == 0:
            # the running metrics over all workers, as fit() reads them at an epoch's end (the batch logs hold
            # the first replica's own: the trainer's models keep them local, sparing a collective a step)
            running = self.model.get_metrics_result()
            loss, accuracy = (_number(running, key) for key in ("loss", "accuracy"))
            now = time.monotonic()
            rate = self.local_batch * self._window_steps / max(now - self._window_start, 1e-9)
            emit(self.role, event="step", epoch=self._epoch + 1, step=self._epoch_steps, loss=loss,
                 accuracy=accuracy, examples_per_sec=round(rate, 1))
            self._window_start, self._window_steps = now, 0

    def on_epoch_end(self, epoch, logs=None):
        seconds = max(time.monotonic() - self._epoch_start, 1e-9)
        training = max(self._train_end - self._epoch_start, 1e-9)  # without validation
        values = {key: _number(logs, key) for key in EPOCH_KEYS if key in (logs or {})}
        self.last = dict(epoch=epoch + 1, epochs=self.epochs, **values,
                         examples_per_sec=round(self.local_batch * self._epoch_steps / training, 1),
                         seconds=round(seconds, 3), **self.epoch_fields())
        emit(self.role, event="epoch", **self.last)
        shown = "  ".join(f"{key} {value:.4f}" for key, value in values.items() if value is not None)
        print(f"epoch {epoch + 1}/{self.epochs}  {shown}  ({seconds:.1f} s, "
              f"{self.last['examples_per_sec']:.0f} examples/s on this worker)", file=sys.stderr, flush=True)

    def finish(self, **fields: Any) -> None:
        """The end line: the last epoch's values, `seconds` in all, and `fields`."""
        last = {k: v for k, v in self.last.items() if k not in ("seconds", "examples_per_sec")}
        emit(self.role, event="end", **last, initial_epoch=self.initial_epoch,
             seconds=round(time.monotonic() - self._train_start, 3), **fields)


def _number(logs, key: str) -> float | None:
    """logs[key] as a rounded float (waiting for the step if it is a tensor), or None."""
    value = (logs or {}).get(key)
    return None if value is None else round(float(value), 6)
