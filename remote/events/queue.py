"""Serve's queue's event: a queued run moved on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueueRunChanged:
    """A queued run moved on (serve's queue runner says it): `state` is "started" (its launch begins),
    "succeeded", "failed" or "cancelled", with `reason` saying why where there is a why. `run_id` is ""
    for an entry cancelled before it started; `settings`: the entry's `--set KEY=VALUE`s."""

    entry_id: str
    job: str
    run_id: str
    state: str
    reason: str = ""
    at: float = field(default_factory=time.time)
    settings: tuple[str, ...] = ()
