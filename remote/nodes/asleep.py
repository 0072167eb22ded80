"""Which nodes homegpu put to sleep: a small file per cluster, so every homegpu process (serve, the TUI,
`status`, a run) tells a node that sleeps from one that is offline.

~/.local/share/homegpu/asleep-NAME-HASH.json (beside the history), `{"NODE": UNIX_TIME_IT_WENT_TO_SLEEP}`,
written whole through a private temporary file and renamed (0600). A node leaves it when homegpu reaches it
again, or wakes it. Only a node with a `mac` is ever marked: without one it could not be woken.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

from homegpu.remote.config import ClusterSpec, cluster_data_path


def asleep_path(spec: ClusterSpec) -> Path:
    return cluster_data_path(spec.source, spec.name, "asleep", "json")


class AsleepNodes:
    """The nodes of one cluster that homegpu put to sleep, as the file says now (read afresh each ask)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.path = asleep_path(spec)

    def since(self, node: str) -> float | None:
        """When `node` was put to sleep, or None when it was not (or has been reached since)."""
        value = self._read().get(node)
        return float(value) if isinstance(value, (int, float)) else None

    def mark(self, node: str, at: float | None = None) -> None:
        self._write({**self._read(), node: time.time() if at is None else at})

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
