"""Where a cluster's history lives: ~/.local/share/homegpu/history-NAME-HASH.sqlite (XDG_DATA_HOME is
honoured), one file per cluster file, as the bandwidth matrix is kept per cluster file. Data, not a
cache: a history is not thrown away when a cache is cleared.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from homegpu.remote.config import EMBEDDED_DEFAULT, ClusterSpec, data_dir


def history_path(spec: ClusterSpec) -> Path:
    """The history file of `spec`'s cluster, told apart from others by the hash of its file's absolute
    path (`--config cluster.toml` in two folders is two clusters)."""
    source = spec.source if spec.source == EMBEDDED_DEFAULT else str(Path(spec.source).resolve())
    digest = hashlib.sha256(source.encode()).hexdigest()[:8]
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in spec.name)
    return data_dir() / f"history-{safe}-{digest}.sqlite"
