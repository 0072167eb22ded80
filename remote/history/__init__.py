"""homegpu.remote.history: the cluster's history in one bounded SQLite file: every node's and GPU's samples in
tiers, GPU process owners, offline intervals (a hub subscriber), and the queries over it.
"""

from __future__ import annotations

from homegpu.remote.history.bound import DEFAULT_MAX_BYTES
from homegpu.remote.history.location import history_path
from homegpu.remote.history.queries import (
    GpuEnergy, GpuSeries, HistoryReader, HostEnergy, NodeOffline, NodeSeries, OfflineInterval, OwnerEnergy, RunHours, UserHours,
)
from homegpu.remote.history.recorder import HistoryRecorder
from homegpu.remote.history.schema import HOST, HistoryDamaged, HistoryError

__all__ = [
    "DEFAULT_MAX_BYTES", "HOST", "GpuEnergy", "GpuSeries", "HistoryDamaged", "HistoryError", "HistoryReader", "HistoryRecorder",
    "HostEnergy", "OwnerEnergy",
    "NodeOffline", "NodeSeries", "OfflineInterval", "RunHours", "UserHours", "history_path",
]
