"""Workers that would resume from different epochs: the run stops at once, naming the checkpoint missing where.

A generation's workers go on from the same epoch when each loads the same checkpoint. Where one does not (the
checkpoint is outside the chief's working dir, where homegpu cannot carry it from, or the job's `checkpoint` key
leaves it out), their collectives still pair up, step for step, epochs of different numbers: one worker finishes
while another waits in a collective, the generation fails, and every restart repeats it. So each worker's first
epoch lines of a generation (the epoch it begins with, and the first it finishes) are compared; a disagreement ends
the run before it spends a restart. Pure: the run notes each metric (FirstEpochs.note) and words the stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from homegpu.remote.events import Metric

NAMED_FILES = 3  # of the files the job's checkpoint key left out


@dataclass
class FirstEpochs:
    """What one worker's first lines of a generation said: the epochs done before its first epoch line (a start's
    initial_epoch, else an epoch or step line's epoch - 1), and the first epoch it finished."""

    before: int | None = None
    finished: int | None = None

    def note(self, metric: Metric) -> None:
        if self.before is None:
            if metric.event == "start":
                self.before = metric.initial_epoch
            elif metric.event in ("epoch", "step") and metric.epoch is not None:
                self.before = metric.epoch - 1
        if self.finished is None and metric.event == "epoch" and metric.epoch is not None:
            self.finished = metric.epoch


def disagreement(firsts: Mapping[str, FirstEpochs]) -> dict[str, int] | None:
    """Each worker's epochs done before this generation, where two of them differ (by the epoch each began with,
    else by the first each finished); None while they agree, or fewer than two have said."""
    for said in ({label: first.before for label, first in firsts.items() if first.before is not None},
                 {label: first.finished - 1 for label, first in firsts.items() if first.finished is not None}):
        if len(set(said.values())) > 1:
            return said
    return None


@dataclass(frozen=True)
class Carried:
    """What homegpu carried from the chief's working dir (`where`) before the generation (CheckpointCopy): `files`,
    what the job's `checkpoint` (`key`) `left` there, and why copies stopped (`refused`)."""

    where: str
    files: Sequence[str] = ()
    left: Sequence[str] = ()
    refused: str = ""
    key: str = ""


def drift_line(said: Mapping[str, int], chief: str, carried: Carried) -> str:
    """One line: each worker's epoch, which checkpoint is missing where, and the fix."""
    ahead = max(said, key=lambda label: (said[label], label == chief))  # who resumed furthest, the chief first
    behind = [label for label, epochs in said.items() if epochs < said[ahead]]
    lack = f"{', '.join(behind)} lack{'s' * (len(behind) == 1)}"
    epochs = ", ".join(f"{label} {_done(n)}" for label, n in said.items())
    if carried.refused:
        detail = carried.refused
    elif carried.key and carried.left:
        named = ", ".join(carried.left[:NAMED_FILES]) + (", …" if len(carried.left) > NAMED_FILES else "")
        detail = (f"{lack} {named} from {ahead}'s working dir, which the job's checkpoint = \"{carried.key}\" leaves "
                  "out: name what the script resumes from there")
    elif ahead != chief:
        detail = (f"{lack} the checkpoint {ahead} resumed from, which is not the chief's ({chief}): homegpu carries "
                  "only the chief's; save it there, or on a filesystem every node shares")
    else:
        held = f" (it carried {', '.join(carried.files[:NAMED_FILES])})" if carried.files else ""
        detail = (f"{lack} the checkpoint {chief} resumed from, which is not in {chief}'s working dir {carried.where}, "
                  f"where homegpu carries it from{held}: save it under a relative path, or on a filesystem every node "
                  "shares")
    return f"workers would resume from different epochs ({epochs}): {detail}; stopped rather than restarted"


def _done(epochs: int) -> str:
    """"with 3 epochs done", "with none done" (0, or -1 where a 0-based script's `Epoch 0` read as counted from 1)."""
    return f"with {epochs} epoch{'s' * (epochs != 1)} done" if epochs > 0 else "with none done"
