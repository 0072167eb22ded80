"""The callback that prints metric lines: start (with the epoch resumed at), steps, epochs, end."""

from __future__ import annotations

import time

import tf_keras as keras

from homegpu.trainer.cluster import WorkerRole
from homegpu.trainer.metrics import format_metric


class MetricLines(keras.callbacks.Callback):
    """Prints PROTOCOL.md lines; examples/s are this worker's (local batch × steps / seconds)."""

    def __init__(self, role: WorkerRole, epochs: int, local_batch: int, log_every: int, data: str) -> None:
        super().__init__()
        self.role, self.epochs, self.local_batch, self.log_every, self.data = role, epochs, local_batch, log_every, data
        self._started = False
        self._train_start = time.monotonic()
        self._epoch_start = self._window_start = time.monotonic()
        self._window_steps = 0
        self._epoch_steps = 0
        self._epoch = 0
        self._last: dict = {}

    def _emit(self, **fields) -> None:
        print(format_metric(worker=self.role.rank, workers=self.role.workers, time=round(time.time(), 3),
                            **fields), flush=True)

    def on_epoch_begin(self, epoch, logs=None):
        if not self._started:  # the first epoch fit() runs is the one BackupAndRestore resumed at
            self._started = True
            self._emit(event="start", initial_epoch=epoch, epochs=self.epochs, data=self.data)
        self._epoch = epoch
        self._epoch_start = self._window_start = time.monotonic()
        self._epoch_steps = self._window_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_steps += 1
        self._window_steps += 1
        if self._window_steps >= self.log_every:
            now = time.monotonic()
            rate = self.local_batch * self._window_steps / max(now - self._window_start, 1e-9)
            self._emit(event="step", epoch=self._epoch + 1, step=batch + 1, loss=_get(logs, "loss"),
                       accuracy=_get(logs, "accuracy"), examples_per_sec=round(rate, 1))
            self._window_start, self._window_steps = now, 0

    def on_epoch_end(self, epoch, logs=None):
        seconds = max(time.monotonic() - self._epoch_start, 1e-9)
        self._last = dict(epoch=epoch + 1, epochs=self.epochs, loss=_get(logs, "loss"),
                          accuracy=_get(logs, "accuracy"),
                          examples_per_sec=round(self.local_batch * self._epoch_steps / seconds, 1),
                          seconds=round(seconds, 3))
        self._emit(event="epoch", **self._last)

    def finish(self) -> None:
        self._emit(event="end", seconds=round(time.monotonic() - self._train_start, 3),
                   **{k: v for k, v in self._last.items() if k != "seconds"})


def _get(logs, key):
    value = (logs or {}).get(key)
    return round(float(value), 6) if value is not None else None
