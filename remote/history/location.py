"""Where a cluster's history lives: ~/.local/share/homegpu/history-NAME-HASH.sqlite (XDG_DATA_HOME is
honoured), one file per cluster file, as the bandwidth matrix is kept per cluster file. Data, not a
cache: a history is not thrown away when a cache is cleared.
"""

from __future__ import annotations

from pathlib import Path

from homegpu.remote.config import ClusterSpec, cluster_data_path


def history_path(spec: ClusterSpec) -> Path:
    """The history file of `spec`'s cluster (home_dirs.cluster_data_path: one per cluster file)."""
    return cluster_data_path(spec.source, spec.name, "history", "sqlite")
