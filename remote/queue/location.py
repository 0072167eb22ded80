"""Where a cluster's queue lives: beside its history, as queue-NAME-HASH.sqlite for history-NAME-HASH.sqlite,
so one cluster file has one queue, found the same way the history is (XDG_DATA_HOME honoured).
"""

from __future__ import annotations

from pathlib import Path

from homegpu.remote.config import ClusterSpec
from homegpu.remote.history import history_path


def queue_path(spec: ClusterSpec) -> Path:
    history = history_path(spec)
    return history.with_name("queue-" + history.name.removeprefix("history-"))
