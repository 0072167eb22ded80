"""[alerts]' events: an alert firing or cleared, and the user's command or a notify URL failing."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class AlertState(str, enum.Enum):
    FIRING = "firing"
    CLEARED = "cleared"


# Alerts about a run: the run is part of what they are about (others are about a node or a GPU). A queued
# run's alerts are about its queue entry too (Alert.queue_id; its run_id is "" when cancelled before it started).
RUN_ALERTS = ("job_failed", "job_stalled", "straggler", "job_succeeded", "run_shrunk", "queued_run_started", "queued_run_succeeded",
              "queued_run_failed", "queued_run_cancelled", "budget_per_run")


@dataclass(frozen=True)
class Alert:
    """A rule of [alerts] met (FIRING), or no longer met (CLEARED); remote/alerts/evaluate.py decides.

    `kind` names the rule (gpu_temperature, gpu_memory, node_offline, job_failed, job_stalled,
    straggler, job_succeeded, run_shrunk, queued_run_started, queued_run_succeeded, queued_run_failed,
    queued_run_cancelled); `value` and `threshold` are in its unit (°C, %, seconds).
    `job` and `run_id` name the run it is about, or for node and GPU alerts the run going on;
    `queue_id` the entry of serve's queue a queued_run_* alert is about ("q-12"), else ""."""

    kind: str
    state: AlertState
    message: str
    node: str = ""
    gpu: int | None = None
    worker: str = ""
    job: str = ""
    run_id: str = ""
    value: float | None = None
    threshold: float | None = None
    at: float = field(default_factory=time.time)
    queue_id: str = ""

    @property
    def key(self) -> tuple:
        """What the alert is about: its CLEARED has the FIRING's key; two queue entries' alerts never share one."""
        return (self.kind, self.node, self.gpu, self.worker, self.run_id if self.kind in RUN_ALERTS else "",
                self.queue_id)


@dataclass(frozen=True)
class AlertCommandFailed:
    """The [alerts] command failed (said once, until it works again)."""

    command: str
    reason: str
    at: float = field(default_factory=time.time)

    heading = "alert command failed"  # how front ends begin the line
    record_kind = "alert_command_failed"  # the timeline's event kind

    @property
    def detail(self) -> str:
        return f"command: {self.command}; said once until it works again"


@dataclass(frozen=True)
class AlertNotifyFailed(AlertCommandFailed):
    """A notify URL, named by its place and service only (`command`: "notify 2 (ntfys://…)"), could not be
    reached (said once, until something reaches it again)."""

    heading = "notification failed"
    record_kind = "alert_notify_failed"

    @property
    def detail(self) -> str:
        return f"{self.command}; said once until one arrives again"
