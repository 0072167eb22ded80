"""homegpu.remote.events: the typed events every room publishes on the hub, one catalogue, with the values they
carry (a node's stats snapshot, a metric, a log line, a bandwidth matrix) and the EventHub that fans them out.
"""

from __future__ import annotations

from homegpu.remote.events.alert import RUN_ALERTS, Alert, AlertCommandFailed, AlertNotifyFailed, AlertState
from homegpu.remote.events.bandwidth import BandwidthMatrix, BandwidthMeasured, LinkResult
from homegpu.remote.events.hub import EventHub, Subscription
from homegpu.remote.events.job import (
    REJOINED, SHRUNK, JobState, JobStateChanged, PreflightResult, Straggler, WorkerExited,
)
from homegpu.remote.events.log_line import LogLine
from homegpu.remote.events.metric import NO_METRIC, RATE_UNITS, Metric, WorkerMetric
from homegpu.remote.events.node import HeldBack, NodeState, NodeStateChanged, NodeStatsUnavailable, NodeStatsUpdated
from homegpu.remote.events.queue import QueueRunChanged
from homegpu.remote.events.stats import (
    NA, GpuProcess, GpuStats, NodeStats, NotAvailable, Number, PcieLink, ProcessOwner, Text, XidErrors,
)

__all__ = [
    "NA", "NO_METRIC", "RATE_UNITS", "REJOINED", "RUN_ALERTS", "SHRUNK", "Alert", "AlertCommandFailed", "AlertNotifyFailed", "AlertState",
    "BandwidthMatrix", "BandwidthMeasured", "EventHub", "GpuProcess", "GpuStats", "HeldBack", "JobState",
    "JobStateChanged", "LinkResult", "LogLine", "Metric", "NodeState", "NodeStateChanged", "NodeStats",
    "NodeStatsUnavailable", "NodeStatsUpdated", "NotAvailable", "Number", "PcieLink", "PreflightResult", "ProcessOwner",
    "QueueRunChanged", "Straggler", "Subscription", "Text", "WorkerExited", "WorkerMetric", "XidErrors",
]
