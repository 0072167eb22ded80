"""Which nodes sleep: a small file per cluster, so every homegpu process (serve, the TUI, `status`, a run)
tells a node that sleeps from one that is offline.

~/.local/share/homegpu/asleep-NAME-HASH.json (beside the history), `{"NODE": {"since": UNIX_TIME, "by_itself":
BOOL}}` (a bare number, as older versions wrote, is a node homegpu put to sleep then), written whole through a
private temporary file and renamed (0600). A node is marked when homegpu puts it to sleep, or when its agent
passes on logind's word that it is about to sleep by itself (node_side/agent/sleep_watch.py); it leaves the file
when homegpu reaches it again, or wakes it. Only a node with a `mac` is ever marked: without one it could not
be woken.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from homegpu.remote.config import ClusterSpec, cluster_data_path


def asleep_path(spec: ClusterSpec) -> Path:
    return cluster_data_path(spec.source, spec.name, "asleep", "json")


@dataclass(frozen=True)
class Spell:
    """A node's sleep: since when, and whether it went by itself (else homegpu put it to sleep)."""

    since: float
    by_itself: bool = False

    def reason(self) -> str:
        at = time.strftime("%H:%M", time.localtime(self.since))
        return f"went to sleep by itself at {at}" if self.by_itself else f"put to sleep by homegpu at {at}"


class AsleepNodes:
    """The nodes of one cluster that homegpu put to sleep, as the file says now (read afresh each ask)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.path = asleep_path(spec)

    def spell(self, node: str) -> Spell | None:
        """`node`'s sleep, or None when it is not marked asleep (or has been reached since)."""
        value = self._read().get(node)
        if isinstance(value, (int, float)):
            return Spell(float(value))
        if isinstance(value, dict) and isinstance(value.get("since"), (int, float)):
            return Spell(float(value["since"]), value.get("by_itself") is True)
        return None

    def mark(self, node: str, at: float | None = None, by_itself: bool = False) -> None:
        since = time.time() if at is None else at
        self._write({**self._read(), node: {"since": since, "by_itself": by_itself}})

    def clear(self, node: str) -> None:
        nodes = self._read()
        if node in nodes:
            del nodes[node]
            self._write(nodes)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or damaged: no node is taken for asleep (they are tried as offline ones)
        return data if isinstance(data, dict) else {}

    def _write(self, nodes: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".asleep-")  # 0600
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(nodes, out)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
