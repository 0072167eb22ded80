"""A queue entry: one run of a job waiting its turn, running, or finished, as a frozen value.

Ids are `q-N`, N increasing from 1 and never reused (the store's AUTOINCREMENT keeps that across
restarts and deletions), so an id a person wrote down, or an `--after` refers to, names one entry forever.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

ID_PREFIX = "q-"
_ID_RE = re.compile(r"(?:q-)?([1-9][0-9]{0,17})")


class QueueError(Exception):
    """A queue request that cannot be done; the message is one line saying why and what to do."""


class QueueWriteError(QueueError):
    """The queue's file could not be written (a full disk): nothing was changed; the same write can be
    tried again later."""


class EntryState(str, enum.Enum):
    WAITING = "waiting"
    STARTING = "starting"  # recorded, with its run id, before the launch begins (see store.py)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Its run may have workers on the nodes."""
        return self in (EntryState.STARTING, EntryState.RUNNING)

    @property
    def finished(self) -> bool:
        return self in (EntryState.SUCCEEDED, EntryState.FAILED, EntryState.CANCELLED)


def entry_id(number: int) -> str:
    return f"{ID_PREFIX}{number}"


def entry_number(text: str) -> int:
    """12 for "q-12" (or "12"). Raises QueueError naming the text."""
    match = _ID_RE.fullmatch(text.strip())
    if not match:
        shown = text if len(text) <= 40 else text[:40] + "…"
        raise QueueError(f"{shown!r} is not a queue id: use an id like q-12 (`homegpu queue` lists them)")
    return int(match.group(1))


@dataclass(frozen=True)
class QueueEntry:
    """One queued run of a job.

    Attributes:
        id: "q-12".
        job: the job's name in cluster.toml.
        overrides: the `--set KEY=VALUE` texts as given, applied (and checked again) when it starts.
        after: ids of the entries that must succeed before it starts.
        priority: higher starts first; equal priorities go in submission order.
        submitted, started, ended: Unix times (None: not yet).
        user: who submitted it.
        run_id: its run's id from the moment it is marked starting ("" before).
        reason: why it waits, or why it failed or was cancelled ("" when there is nothing to say).
    """

    id: str
    job: str
    overrides: tuple[str, ...]
    after: tuple[str, ...]
    priority: int
    submitted: float
    user: str
    state: EntryState
    run_id: str = ""
    reason: str = ""
    started: float | None = None
    ended: float | None = None

    @property
    def number(self) -> int:
        return entry_number(self.id)

    @property
    def order(self) -> tuple[int, float, int]:
        """The order entries are considered in: priority (higher first), then submission."""
        return (-self.priority, self.submitted, self.number)
