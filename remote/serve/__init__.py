"""homegpu.remote.serve: the always-on manager's parts: runs started elsewhere followed read-only, the
job board, and the Prometheus endpoint (`homegpu serve` in tui/ puts them together).
"""

from __future__ import annotations

from homegpu.remote.serve.exporter import ClusterCollector
from homegpu.remote.serve.job_board import JobBoard, RunFigures
from homegpu.remote.serve.metrics_http import MetricsEndpoint
from homegpu.remote.serve.run_follower import RunFollower

__all__ = ["ClusterCollector", "JobBoard", "MetricsEndpoint", "RunFigures", "RunFollower"]
