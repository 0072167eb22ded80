"""The run's timeline: every node's and worker's samples and every event, in experiments/RUN-ID/timeline.sqlite.

One more subscriber of the event hub, a `SampleRecorder` (store/): `TimelineRecorder.handle(event)` only
appends rows to a buffer, written in one transaction once a second of event time has passed. Long runs
stay bounded: samples older than `full_rate_seconds` are averaged into `bucket_seconds` buckets as time
goes on.

The reader, :func:`load_timeline`, turns the file back into frozen snapshots for the report.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from pathlib import Path
from typing import Iterable

from homegpu.remote.events import (
    NA, Alert, AlertCommandFailed, JobState, JobStateChanged, Metric, NodeState, NodeStateChanged, NodeStatsUnavailable,
    NodeStatsUpdated, PreflightResult, Straggler, WorkerExited, WorkerMetric,
)
from homegpu.remote.record.timeline_schema import (
    SCHEMA, Timeline, TimelineDamaged, check_timeline, add_missing_columns, read_timeline,
)
from homegpu.remote.store import FLUSH_SECONDS, SampleRecorder, bucket_time_sql

FULL_RATE_SECONDS = 3600.0
BUCKET_SECONDS = 10.0
COMPACT_EVERY_SECONDS = 60.0
_WORKER_SAMPLE_EVENTS = ("step", "epoch", "end")

_INSERT = {
    "node_samples": "INSERT INTO node_samples VALUES (?,?,?,?,?,?,?,?)",
    "gpu_samples": "INSERT INTO gpu_samples VALUES (?,?,?,?,?,?,?,?,?,?)",
    "worker_samples": "INSERT INTO worker_samples VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
    "events": "INSERT INTO events VALUES (?,?,?,?,?,?)",
}

# Averages one time range into buckets; epoch/end rows of workers are kept as they are (one per epoch).
_COMPACT = {
    "node_samples": ("node", "avg(cpu), avg(mem_used), max(mem_total), avg(load1), max(host_energy), avg(host_power)",
                     ""),
    "gpu_samples": ("node, gpu", "avg(util), avg(mem_used), max(mem_total), avg(temp), avg(power), "
                    "avg(sm_clock), max(energy)", ""),  # the counter's last reading: its differences still add up
    "worker_samples": ("worker, 'step'", "max(epoch), max(step), avg(loss), avg(accuracy), avg(val_loss), "
                       "avg(val_accuracy), avg(examples_per_sec), avg(steps_per_sec), avg(compute_examples_per_sec)",
                       "AND event = 'step'"),
}


def _stat(value: object) -> object:
    """A parsed stats value for SQLite: the parser gives only numbers and NA, and NA becomes NULL."""
    return None if value is NA else value


def _num(value: object) -> float | None:
    """A number from a metric line for SQLite; NA, None and anything else become NULL."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


class TimelineRecorder(SampleRecorder):
    """Writes one run's timeline; one instance is the file's only writer.

    Args:
        path: the sqlite file (created with its folder; an existing one is appended to, as when a
            controller attaches to a run again).
        full_rate_seconds: samples newer than this (against the latest event time) keep every row.
        bucket_seconds: older samples are averaged into buckets of this many seconds.
        nodes: record node stats and node states of these nodes only (the job's; the hub carries the
            whole cluster's); None records every node.
    """

    TASK_NAME = "timeline"

    def __init__(self, path: Path, full_rate_seconds: float = FULL_RATE_SECONDS,
                 bucket_seconds: float = BUCKET_SECONDS, nodes: Iterable[str] | None = None) -> None:
        self.path = Path(path)
        self.nodes = frozenset(nodes) if nodes is not None else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        set_aside = _set_aside_if_damaged(self.path)
        self.full_rate_seconds, self.bucket_seconds = full_rate_seconds, bucket_seconds
        super().__init__(sqlite3.connect(self.path, isolation_level=None))
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        add_missing_columns(self._db)  # appending to a timeline an older homegpu wrote
        self._pending: dict[str, list[tuple]] = {table: [] for table in _INSERT}
        self._batch_sizes: dict[str, int] = {}  # worker -> per-worker batch, to turn examples/s into steps/s
        self._last_flush: float | None = None
        self._compacted_until = self._read_compacted_until()
        self._latest = 0.0
        self._state: JobState | None = None  # the run's last state: a second one alike is a phase of it
        if set_aside:
            self.record_event("timeline_damaged", time.time(), set_aside)

    # -- recording ----------------------------------------------------------------------------

    def _due(self, event: object) -> bool:
        """A second of event time since the last write (the first event's time starts the count)."""
        at = getattr(event, "at", None)
        if at is None:
            return False
        self._latest = max(self._latest, at)
        if self._last_flush is None:
            self._last_flush = at
        return at - self._last_flush >= FLUSH_SECONDS

    def record_event(self, kind: str, at: float, summary: str = "", node: str = "", worker: str = "",
                     details: dict | None = None) -> None:
        """Record an event that has no hub dataclass here (an alert, a stop asked for by the user)."""
        self._pending["events"].append(
            (at, kind, node, worker, summary, json.dumps(details or {}, default=str)))
        self._latest = max(self._latest, at)

    def set_meta(self, **values: object) -> None:
        """Store run-level facts (run_id, job, started) in the meta table at once."""
        self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                             [(key, json.dumps(value, default=str)) for key, value in values.items()])

    def flush(self) -> None:
        """Write every buffered row in one transaction, then compact what has aged out of full rate."""
        self._last_flush = self._latest
        if not any(self._pending.values()):
            return
        with self._db:
            self._db.execute("BEGIN")
            for table, rows in self._pending.items():
                if rows:
                    self._db.executemany(_INSERT[table], rows)
                    rows.clear()
        horizon = self._latest - self.full_rate_seconds
        if horizon - self._compacted_until >= COMPACT_EVERY_SECONDS:
            self._compact(horizon)

    # -- per event kind ---------------------------------------------------------------------------

    def _other_node(self, node: str) -> bool:
        """Whether `node` is one this run does not use (the hub carries the whole cluster's)."""
        return self.nodes is not None and node not in self.nodes

    def _stats(self, event: NodeStatsUpdated) -> None:
        stats, at, node = event.stats, event.at, event.node
        if self._other_node(node):
            return
        self._pending["node_samples"].append(
            (at, node, _stat(stats.cpu), _stat(stats.mem_used), _stat(stats.mem_total), _stat(stats.load[0]),
             _stat(stats.host_energy), _stat(stats.host_power)))
        self._pending["gpu_samples"].extend(
            (at, node, _stat(gpu.index) or 0, _stat(gpu.util), _stat(gpu.mem_used), _stat(gpu.mem_total),
             _stat(gpu.temp), _stat(gpu.power), _stat(gpu.sm_clock), _stat(gpu.energy))
            for gpu in stats.gpus)

    def _metric(self, event: WorkerMetric) -> None:
        metric = event.metric
        if metric.event == "start":
            if metric.batch_size:
                self._batch_sizes[event.worker] = metric.batch_size
            self.record_event("worker_start", event.at, _start_summary(metric), worker=event.worker,
                              details=dict(metric.fields))
        elif metric.event == "error":
            self.record_event("worker_error", event.at, metric.message, worker=event.worker,
                              details=dict(metric.fields))
        if metric.event not in _WORKER_SAMPLE_EVENTS:
            return
        rate = metric.examples_per_sec
        batch = self._batch_sizes.get(event.worker)
        self._pending["worker_samples"].append(
            (event.at, event.worker, metric.event, metric.epoch, metric.step, metric.loss, metric.accuracy,
             metric.val_loss, metric.val_accuracy, rate, rate / batch if rate is not None and batch else None,
             metric.compute_examples_per_sec))

    def _job_state(self, event: JobStateChanged) -> None:
        details = {"state": event.state.value, "generation": event.generation, "restarts": event.restarts,
                   "detail": event.detail, "run_id": event.run_id, "job": event.job}
        if event.regroup:
            details["regroup"] = event.regroup
        kind = _STATE_KINDS.get(event.state, "state")
        if event.state.finished:
            kind = "end"
        elif event.state is self._state:
            kind = "phase"  # "syncing code" during preflight, "saving the model" while running
        self._state = event.state
        summary = event.state.value + (f": {event.detail}" if event.detail else "")
        self.record_event(kind, event.at, summary, details=details)
        if event.state is JobState.RESTARTING and "stalled" in event.detail:
            self.record_event("stall", event.at, event.detail, details=details)

    def _preflight(self, event: PreflightResult) -> None:
        summary = "; ".join(event.problems) if event.problems else f"ready ({event.gpus or 'no GPU'})"
        if event.warnings:
            summary += "; warning: " + "; ".join(event.warnings)
        self.record_event("preflight", event.at, summary, node=event.node,
                          details={"problems": list(event.problems), "gpus": event.gpus, "ok": not event.problems,
                                   "warnings": list(event.warnings)})

    def _worker_exit(self, event: WorkerExited) -> None:
        self.record_event("worker_exit", event.at, f"exit {event.exit_status}: {event.meaning}", worker=event.worker,
                          details={"exit_status": event.exit_status, "meaning": event.meaning,
                                   "generation": event.generation})

    def _straggler(self, event: Straggler) -> None:
        self.record_event("straggler", event.at,
                          f"{event.examples_per_sec:.0f} examples/s against {event.others_median:.0f} for the others"
                          f"{event.cause_text}",
                          worker=event.worker, details={"examples_per_sec": event.examples_per_sec,
                                                        "others_median": event.others_median,
                                                        "held_back": list(event.held_back)})

    def _node_state(self, event: NodeStateChanged) -> None:
        if self._other_node(event.node):
            return
        kind = {NodeState.OFFLINE: "node_offline", NodeState.ONLINE: "node_online",
                NodeState.ASLEEP: "node_asleep"}.get(event.state, "node_state")
        self.record_event(kind, event.at, event.state.value + (f": {event.reason}" if event.reason else ""),
                          node=event.node, details={"state": event.state.value, "reason": event.reason})

    def _stats_unavailable(self, event: NodeStatsUnavailable) -> None:
        if self._other_node(event.node):
            return
        self.record_event("stats_unavailable", event.at, event.reason, node=event.node)

    def _alert(self, event: Alert) -> None:
        if event.node and self._other_node(event.node):
            return
        self.record_event("alert", event.at, f"{event.state.value}: {event.message}", node=event.node,
                          worker=event.worker, details={"alert": event.kind, "state": event.state.value,
                                                        "gpu": event.gpu, "value": event.value,
                                                        "threshold": event.threshold})

    def _alert_command_failed(self, event: AlertCommandFailed) -> None:
        self.record_event(event.record_kind, event.at, event.reason, details={"command": event.command})

    _HANDLERS = {
        NodeStatsUpdated: _stats, WorkerMetric: _metric, JobStateChanged: _job_state, PreflightResult: _preflight,
        WorkerExited: _worker_exit, Straggler: _straggler, NodeStateChanged: _node_state,
        NodeStatsUnavailable: _stats_unavailable, Alert: _alert, AlertCommandFailed: _alert_command_failed,
    }

    # -- downsampling -----------------------------------------------------------------------------

    def _read_compacted_until(self) -> float:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'compacted_until'").fetchone()
        return json.loads(row[0]) if row else 0.0

    def _compact(self, horizon: float) -> None:
        """Average samples in [compacted_until, horizon) into buckets; whole buckets only."""
        size = self.bucket_seconds
        until = (horizon // size) * size
        since = self._compacted_until
        if until <= since:
            return
        with self._db:
            self._db.execute("BEGIN")
            for table, (keys, aggregates, only) in _COMPACT.items():
                bucket = bucket_time_sql("t", size)
                rows = self._db.execute(
                    f"SELECT {bucket} AS b, {keys}, {aggregates} FROM {table} "
                    f"WHERE t >= ? AND t < ? {only} GROUP BY b, {keys}", (since, until)).fetchall()
                self._db.execute(f"DELETE FROM {table} WHERE t >= ? AND t < ? {only}", (since, until))
                self._db.executemany(_INSERT[table], rows)
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('compacted_until', ?)", (json.dumps(until),))
        self._compacted_until = until


def _set_aside_if_damaged(path: Path) -> str:
    """Rename an existing timeline that cannot be appended to (a controller attaching again finds it
    truncated, say), so recording starts a new one; what was done, in one line ("" if nothing)."""
    if not path.exists():
        return ""
    try:
        check_timeline(path)
        return ""
    except TimelineDamaged as exc:
        kept = next(path.with_name(f"{path.name}.damaged{n or ''}") for n in itertools.count()
                    if not path.with_name(f"{path.name}.damaged{n or ''}").exists())
        path.rename(kept)
        wal = path.with_name(path.name + "-wal")  # the damaged file's, not the new one's
        if wal.exists():
            wal.rename(kept.with_name(kept.name + "-wal"))
        path.with_name(path.name + "-shm").unlink(missing_ok=True)
        return f"{exc}: kept as {kept.name}; this timeline starts when recording resumed"


_STATE_KINDS = {
    JobState.PREFLIGHT: "preflight_start", JobState.STARTING: "launch", JobState.RUNNING: "running",
    JobState.RESTARTING: "restart", JobState.STOPPING: "stop",
}


def _start_summary(metric: Metric) -> str:
    if metric.fields.get("resumed"):
        return f"started, resumed at epoch {metric.initial_epoch}"
    return "started"


def load_timeline(path: Path) -> Timeline:
    """Read a timeline.sqlite (even while its writer runs: WAL) into frozen snapshots.

    Raises:
        FileNotFoundError: there is no file at `path`.
        TimelineDamaged: the file cannot be read as a timeline (the message names it).
    """
    return read_timeline(Path(path))
