"""Progress from what a training script prints by itself: epoch lines and tqdm bars, read when a log has shown
neither a HOMEGPU_METRIC line nor Keras's output (classify.py decides). A PyTorch script has no standard
output; these are the shapes tutorials print, turned into dicts shaped like the protocol's events:

    Epoch 3/10                       -> "start" the first time; later, "epoch" for the previous epoch
    Epoch [3/10], Loss: 0.2345       -> "epoch" 3 done, with its figures (a loss or an accuracy)
    [GPU0] Epoch 3 | Loss 0.2345     -> "epoch" 3 (bracketed prefixes first are fine; no total: epochs None)
    Epoch [1/5], Step [100/600], Loss: 2.23      -> "step" 100 of 600 in epoch 1
    Train Epoch: 1 [640/60000 (1%)]  Loss: 2.29  -> "step" (pytorch/examples' mnist)
    Epoch 3:  45%|████▌     | 45/100 [00:02<00:01, 20.10it/s, loss=0.234]  -> "step" 45 of 100 in epoch 3
    Epoch 3: 100%|██████████| 100/100 [00:05<00:00, 19.9it/s, loss=0.2]    -> "epoch" 3 done
    100%|██████████| 100/100 [00:05<00:00, 19.9it/s]                          -> "step" 100 of 100

Epochs are counted from 1, as the protocol's are, whatever the script counts from (the examples above count
from 1): a script whose first epoch line says `Epoch 0` counts from 0 (the DDP tutorial's `for epoch in
range(...)`), so its `Epoch 0` is epoch 1 and its `Epoch 2` the third; any other first number is a count from 1
(`Epoch 1/3`). EpochNumbers learns it once per worker and keeps it across the run's generations, where a resumed
0-based script's first line is `Epoch 3`. A total (`/10`) is taken as printed. Figures are `name: value`,
`name=value` or `Loss value`, named in lower case (`Loss` is `loss`; the protocol's counts, such as `Steps: 64`,
are not taken as figures); a tqdm rate becomes `steps_per_sec`.
A line must begin with the epoch (after `[...]` prefixes) or be a bar, so "Resuming from Epoch 3" is text.
"""

from __future__ import annotations

import math
import re

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_EPOCH = re.compile(r"^(?:\[[^\]]*\]\s*)*(?:train(?:ing)?\s+)?epoch\b\s*[:#]?\s*\[?\s*(\d+)\s*(?:(?:/|of)\s*(\d+))?\s*\]?",
                    re.IGNORECASE)
_FRACTION = re.compile(r"\[?\s*(\d+)\s*/\s*(\d+)\b")
_FIGURE = re.compile(rf"\b([A-Za-z][\w ]*?)\s*(?:([:=])\s*|\s+(?=[-+.\d]))({_NUMBER}|nan|inf)\b", re.IGNORECASE)
_COUNTS = frozenset({"event", "epoch", "epochs", "step", "steps", "worker", "workers", "time"})  # not figures
_TQDM = re.compile(r"^(?P<desc>.*?)\s*(?P<percent>\d+)%\|[^|]*\|\s*(?P<n>\d+)/(?P<total>\d+)\s*"
                   r"\[[^,\]]*(?:,\s*(?P<rate>[\d.]+)(?P<unit>\w*/s|s/\w+))?[^,\]]*(?P<postfix>(?:,[^\]]*)?)\]\s*$")


class EpochNumbers:
    """How a worker's script numbers its epochs, told by the first epoch it names: `Epoch 0` means it counts
    from 0, any other number from 1. Kept in the worker's track across the run's generations."""

    def __init__(self) -> None:
        self.first: int | None = None  # the number the script gives its first epoch (0 or 1), None before any

    def counted(self, printed: int) -> int:
        """The epoch the script printed as `printed`, counted from 1."""
        if self.first is None:
            self.first = 0 if printed == 0 else 1
        return printed + 1 - self.first


class ScriptProgress:
    """Reads one worker's completed console lines; `feed` returns an event dict or None.

    Args:
        numbers: how the script numbers its epochs, where a run's earlier generation told it (a fresh one else).
    """

    def __init__(self, numbers: EpochNumbers | None = None) -> None:
        self.numbers = numbers or EpochNumbers()
        self.started = False
        self.header = 0  # the last bare `Epoch N` line's epoch (counted from 1), 0 before any
        self.summaries = False  # an epoch line with figures came: bare ones are headers that say nothing

    def feed(self, line: str) -> dict | None:
        """The event `line` completes, or None for any other line."""
        text = line.strip()
        bar = _TQDM.match(text)
        if bar:
            event = _bar(bar, self.numbers)
            self.started = True
            self.summaries = self.summaries or event["event"] == "epoch"
            return event
        found = _EPOCH.match(text)
        return self._epoch_line(found, text[found.end():]) if found else None

    def _epoch_line(self, found: re.Match, rest: str) -> dict | None:
        epoch, epochs = self.numbers.counted(int(found.group(1))), _count(found.group(2))
        figures = _figures(rest)
        within = _FRACTION.search(rest)
        if within and int(within.group(1)) < int(within.group(2)):
            return {"event": "step", "epoch": epoch, "step": int(within.group(1)), "steps": int(within.group(2)),
                    **figures}
        if any(map(_is_figure, figures)):
            self.started = self.summaries = True
            return {"event": "epoch", "epoch": epoch, "epochs": epochs, **figures}
        return None if self.summaries else self._header(epoch, epochs)

    def _header(self, epoch: int, epochs: int | None) -> dict | None:
        """A bare `Epoch N` line starts epoch N: the first says the run started, the next one that the
        previous epoch is done (a repeat, from a node's second process or a second line, says nothing)."""
        previous, self.header = self.header, epoch
        if not self.started:
            self.started = True
            return {"event": "start", "epochs": epochs, "initial_epoch": epoch - 1, "resumed": epoch > 1}
        if epoch == previous + 1:
            return {"event": "epoch", "epoch": previous, "epochs": epochs}
        return None


def _bar(bar: re.Match, numbers: EpochNumbers) -> dict:
    """A tqdm line: a step of its bar, or the epoch its description names done when the bar is full."""
    n, total = int(bar.group("n")), int(bar.group("total"))
    fields: dict = _figures(bar.group("postfix"))
    rate, unit = bar.group("rate"), bar.group("unit") or ""
    if rate:
        fields["steps_per_sec"] = float(rate) if unit.endswith("/s") else round(1 / max(float(rate), 1e-9), 3)
    epoch = _EPOCH.match(bar.group("desc").strip())
    if epoch and n == total:
        return {"event": "epoch", "epoch": numbers.counted(int(epoch.group(1))), "epochs": _count(epoch.group(2)),
                "steps": total, **fields}
    where = {"epoch": numbers.counted(int(epoch.group(1)))} if epoch else {}
    return {"event": "step", **where, "step": n, "steps": total, **fields}


def _figures(text: str) -> dict:
    """`name: value` (or `=`) pairs of `text`, and `Loss 0.2` (a loss or an accuracy without a sign between);
    names in lower case with spaces as `_`; a NaN or infinity is None."""
    figures = {}
    for name, sign, value in _FIGURE.findall(text or ""):
        name = name.strip().lower().replace(" ", "_")
        if (sign or _is_figure(name)) and name not in _COUNTS:
            number = float(value)
            figures[name] = number if math.isfinite(number) else None
    return figures


def _is_figure(name: str) -> bool:
    """Whether a name says how training goes: a loss or an accuracy (what tells an epoch's summary line)."""
    return "loss" in name or "acc" in name


def _count(text: str | None) -> int | None:
    return int(text) if text else None
