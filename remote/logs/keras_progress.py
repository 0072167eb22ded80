"""Progress from standard Keras output: metric events read from what `fit()` and `evaluate()` print.

A script that prints no HOMEGPU_METRIC lines (trainer/PROTOCOL.md) still shows its progress: its
console lines, completed by console.ConsoleLines (so a progress bar is one line), are read here
and turned into dicts shaped like the protocol's events, with the same field names.

Recognised (tf-keras and Keras 3, verbose 1 and 2; recordings in tests/fixtures/keras/):

    Epoch 3/12                                                      -> "start" (first fit epoch)
    40/40 [====] - 3s 81ms/step - loss: 0.0045 - accuracy: 1.0000 - val_loss: ...   -> "epoch"
    40/40 ━━━━━━ 3s 81ms/step - accuracy: 1.0000 - loss: 0.0045 - val_accuracy: ...  -> "epoch"
    40/40 - 3s - loss: 0.0045 - accuracy: 1.0000 - 557ms/epoch - 14ms/step           -> "epoch"
    12/40 [==>.] - ETA: 1s - loss: 0.0101 - accuracy: 0.9800          -> "step" (an unfinished bar)
    16/16 [====] - 0s 2ms/step - loss: 0.1520 - accuracy: 0.9805     -> "evaluate" (no Epoch line)

Fields, as in the protocol: `epoch` (1-based) and `epochs` come from the preceding `Epoch N/M`
line; every `name: value` Keras printed becomes a field of that name (`loss`, `accuracy`,
`val_loss`, `val_accuracy`, or whatever metrics the script compiled; `nan` becomes None);
`steps` (the bar's total), `seconds` (the epoch's time as Keras printed it: whole seconds from a
verbose=1 bar, `ms/epoch` from verbose=2), `ms_per_step`, `steps_per_sec` (1000 / ms_per_step; Keras
rounds ms/step to an integer, so fast steps are coarse) and `examples_per_sec` (only when the batch
size per worker is given). A "start" event has `epochs`, `initial_epoch` (N - 1: BackupAndRestore
resumed at epoch N) and `resumed`. Callers add `worker`, `workers` and `time` themselves.

Usage:
    progress = KerasProgress(batch_size=64)   # one per worker: the epoch number is state
    for line in console.feed(chunk):
        if (event := progress.feed(line)) is not None: publish(event)
"""

from __future__ import annotations

import math
import re

_EPOCH = re.compile(r"^Epoch (\d+)/(\d+)$")
_BAR = re.compile(r"^\s*(\d+)/(\d+|Unknown)(?= \[[=>.]*\]| ━| - | *$)(.*)$")
_METRIC = re.compile(r"^([A-Za-z_][\w./]*): ([-+]?(?:\d[\d.]*(?:e[-+]?\d+)?|nan|inf))$")
_PER = re.compile(r"(\d+(?:\.\d+)?)(s|ms|us)/(step|epoch)\b")
_ELAPSED = re.compile(r"(?:^|\s)(\d+)s(?=\s|$)")
_TO_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001}
_RATES = ("seconds", "ms_per_step", "steps_per_sec", "examples_per_sec", "steps")  # not in "end"


class KerasProgress:
    """Reads one worker's completed console lines; `feed` returns an event dict or None.

    Args:
        batch_size: this worker's batch size, when known; `examples_per_sec` needs it.
    """

    def __init__(self, batch_size: int | None = None) -> None:
        self.batch_size = batch_size
        self.epoch = 0  # from the last `Epoch N/M` line; 0 before any
        self.epochs = 0
        self.last_epoch: dict = {}  # the last "epoch" event, for `end()`
        self._awaiting_summary = False  # an Epoch line came and its summary line has not

    def feed(self, line: str) -> dict | None:
        """The event `line` completes, or None for any other line."""
        text = line.strip()
        header = _EPOCH.match(text)
        if header:
            return self._epoch_header(int(header.group(1)), int(header.group(2)))
        bar = _BAR.match(text)
        return self._bar(*bar.groups()) if bar else None

    def end(self) -> dict | None:
        """An "end" event with the last epoch's figures (for when the script exits), or None."""
        if not self.last_epoch:
            return None
        figures = {k: v for k, v in self.last_epoch.items() if k not in _RATES and k != "event"}
        return {"event": "end", **figures}

    def _epoch_header(self, epoch: int, epochs: int) -> dict | None:
        continues = epochs == self.epochs and epoch == self.epoch + 1
        self.epoch, self.epochs, self._awaiting_summary = epoch, epochs, True
        if continues:
            return None
        return {"event": "start", "epochs": epochs, "initial_epoch": epoch - 1, "resumed": epoch > 1}

    def _bar(self, current: str, target: str, rest: str) -> dict | None:
        metrics, timing = _split(rest)
        if not metrics:
            return None  # predict(), or not a Keras bar at all
        finished = target != "Unknown" and current == target and "ETA:" not in rest
        fields = {**metrics, **self._rates(timing)}
        if not finished:
            if not self._awaiting_summary:
                return None
            fields.pop("seconds", None)  # an unfinished Keras 3 bar shows its ETA there
            return {"event": "step", "epoch": self.epoch, "step": int(current), **fields}
        fields = {**fields, "steps": int(target)}
        if not self._awaiting_summary:
            return {"event": "evaluate", **fields}
        self._awaiting_summary = False
        self.last_epoch = {"event": "epoch", "epoch": self.epoch, "epochs": self.epochs, **fields}
        return dict(self.last_epoch)

    def _rates(self, timing: str) -> dict:
        """seconds, ms_per_step, steps_per_sec, examples_per_sec from the bar's time texts."""
        rates: dict = {}
        elapsed = _ELAPSED.search(_PER.sub("", timing))
        if elapsed:
            rates["seconds"] = float(elapsed.group(1))
        for number, unit, per in _PER.findall(timing):
            ms = float(number) * _TO_MS[unit]
            if per == "epoch":
                rates["seconds"] = round(ms / 1000, 3)
            else:
                rates["ms_per_step"] = ms
        ms = rates.get("ms_per_step")
        if ms:
            rates["steps_per_sec"] = round(1000 / ms, 2)
            if self.batch_size:
                rates["examples_per_sec"] = round(self.batch_size * 1000 / ms, 1)
        return rates


def _split(rest: str) -> tuple[dict, str]:
    """The `name: value` metrics of a bar's text, and its other parts (times) joined."""
    metrics, timing = {}, []
    for part in rest.split(" - "):
        part = part.strip()
        if part.startswith("ETA:"):
            continue
        found = _METRIC.match(part)
        if found:
            metrics[found.group(1)] = _number(found.group(2))
        else:
            timing.append(part)
    return metrics, " ".join(timing)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
