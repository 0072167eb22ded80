"""What the TUI shows, kept up to date from the cluster's events.

Pure: no Textual, no I/O. The app feeds every event to :meth:`ClusterView.apply` and re-renders the
parts it reports as changed; tests and snapshots feed recorded events the same way. Everything here
is bounded (histories, loss curve, log buffers), however long the TUI runs or however much a
container prints.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import (
    RUN_ALERTS, Alert, AlertCommandFailed, AlertState, BandwidthMatrix, BandwidthMeasured, GpuStats, HeldBack, JobState,
    JobStateChanged, LinkResult, LogLine, Metric, NodeState, NodeStateChanged, NodeStats, NodeStatsUnavailable,
    NodeStatsUpdated, PreflightResult, Straggler, WorkerExited, WorkerMetric,
)
from homegpu.remote.logs import TracebackFold
from homegpu.remote.nodes import visible, visible_fields
from homegpu.remote.record import RunFolder
from homegpu.tui.view.gpu_trail import GpuTrail
from homegpu.tui.view.text import EpochEcho, epoch_line, share_text, step_text

LOSS_POINTS = 2_000
LOG_LINES = 5_000  # per buffer (each node, and the merged view)
MAX_LINE = 2_000  # characters kept of one log line; a container printing megabyte lines stays bounded

# The parts of the screen an event can change (ClusterView.apply returns a set of them).
NODES, JOB, LOGS, BANDWIDTH, ALERTS = "nodes", "job", "logs", "bandwidth", "alerts"
NOTICES = 20  # toasts waiting for the app to show them


def trail_key(gpu: GpuStats) -> int:
    """Which trail a GPU's samples go to: its index (0 when the node cannot say)."""
    return int(gpu.index) if isinstance(gpu.index, (int, float)) else 0


@dataclass
class NodeView:
    """One node as the screen knows it: state, latest stats, its GPUs' trail since the TUI opened and what
    holds them back as the node's session judged it (a reason held a moment is not shown; remote/nodes/health.py)."""

    name: str
    host: str
    state: NodeState = NodeState.CONNECTING
    reason: str = ""
    fingerprint: str = ""
    stats: NodeStats | None = None
    stats_problem: str = ""
    trail: dict[int, GpuTrail] = field(default_factory=dict)  # by trail_key; bounded (tui/view/gpu_trail.py)
    health: HeldBack = HeldBack()  # the session's judgement, carried on NodeStatsUpdated

    @property
    def online(self) -> bool:
        return self.state is NodeState.ONLINE

    def take_stats(self, stats: NodeStats, held_back: HeldBack = HeldBack()) -> None:
        self.stats, self.stats_problem, self.health = stats, "", held_back
        for gpu in stats.gpus:
            self.trail.setdefault(trail_key(gpu), GpuTrail()).add(stats.timestamp, gpu.util, gpu.mem_percent)


@dataclass
class JobView:
    """The job run on screen: its state, progress, loss curve and per-worker speed."""

    job: str
    run_id: str = ""
    state: JobState = JobState.PREFLIGHT
    generation: int = 1
    restarts: int = 0
    detail: str = ""
    epochs: int | None = None
    epoch: int = 0
    steps_per_epoch: int | None = None
    params: int | None = None
    loss: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LOSS_POINTS))
    accuracy: float | None = None
    rates: dict[str, float] = field(default_factory=dict)
    places: dict[str, int] = field(default_factory=dict)  # worker -> its index, where its shares are
    shares: tuple[int, ...] | None = None  # a balanced run's shares of a step (the chief's last word)
    steps: dict[str, Metric] = field(default_factory=dict)  # worker -> its last epoch line with a step in parts
    stragglers: set[str] = field(default_factory=set)
    preflight: dict[str, PreflightResult] = field(default_factory=dict)
    exits: dict[str, WorkerExited] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return not self.state.finished

    def share_text(self, worker: str) -> str:
        """"422/512": the worker's share of a step in a balanced run of a worker each; "" otherwise."""
        return share_text(self.shares, self.places.get(worker), len(self.rates))

    def step_text(self, worker: str) -> str:
        """"a step 1.09 s compute + 0.16 s besides + 0.09 s waiting": a balanced run's worker's last epoch's
        step in parts; "" where it told none."""
        return step_text(self.steps.get(worker))

    def take_metric(self, event: WorkerMetric) -> None:
        metric = event.metric
        if metric.event in ("step", "epoch") and metric.examples_per_sec is not None:
            self.rates[event.worker] = metric.examples_per_sec
            self.places[event.worker] = event.index
        if metric.event == "epoch" and metric.compute_seconds is not None:
            self.steps[event.worker] = metric
        if event.index != 0:
            return  # loss and progress are global: every worker prints the same; read the chief's
        self.shares = metric.shares or self.shares
        if metric.epochs is not None:
            self.epochs = metric.epochs
        if metric.event == "start":
            self.steps_per_epoch = metric.steps_per_epoch or self.steps_per_epoch
            self.params = metric.params or self.params
            self.epoch = max(self.epoch, metric.initial_epoch or 0)
        elif metric.progressed:
            if metric.event != "step" and metric.epoch is not None:
                self.epoch = max(self.epoch, metric.epoch)
            if metric.accuracy is not None:
                self.accuracy = metric.accuracy
            self._add_loss(metric)

    def _add_loss(self, metric: Metric) -> None:
        loss, epoch = metric.loss, metric.epoch
        if metric.event == "end" or loss is None or epoch is None:
            return
        x = float(epoch)
        if metric.event == "step":
            step, per_epoch = metric.step, self.steps_per_epoch
            if step is None or not per_epoch:
                return
            x = epoch - 1 + min(step, per_epoch) / per_epoch
        self.loss.append((x, loss))


@dataclass(frozen=True)
class LogEntry:
    node: str
    worker: str
    text: str


class LogBuffers:
    """The job's log lines: the merged view and one buffer per node, each bounded to `max_lines`.
    Each traceback is shown once, bounded (`fold`: remote/logs/traceback_fold.py).

    `version` counts appended lines so a view knows when to redraw.
    """

    MERGED = ""

    def __init__(self, nodes: Iterable[str], max_lines: int = LOG_LINES) -> None:
        self.max_lines = max_lines
        self.buffers: dict[str, collections.deque[LogEntry]] = {
            name: collections.deque(maxlen=max_lines) for name in (self.MERGED, *nodes)}
        self.version = 0
        self.fold = TracebackFold()
        self._nodes: dict[str, str] = {}  # worker -> its node, for the lines the fold says later
        self._echo = EpochEcho()

    def add(self, line: LogLine) -> None:
        worker = line.worker or line.node
        self._nodes[worker] = line.node
        shown = self.fold.feed(worker, line.text)  # the fold reads every line, even those not shown
        if not self._echo.repeats(worker, line.text):
            self._append(worker, shown)

    def epoch(self, worker: str, text: str) -> None:
        """`worker` ended an epoch: its figures as one line, `* epoch 2/6  loss …`, as `run --no-tui` shows
        them (a script's Keras prints them as a progress line, which is a metric, not a log line)."""
        self._echo.shown(worker)
        self._append(worker, [*self.fold.end(worker), f"* {text}"])

    def end(self, worker: str) -> bool:
        """`worker` printed a metric line: a traceback's message before it is over. Whether lines came."""
        return self._append(worker, self.fold.end(worker))

    def settle(self, done: bool) -> bool:
        """Before a state change: what the fold cut so far, or (`done`: the generation's logs were read
        to their end) all it still holds. Whether lines came."""
        lines = self.fold.finish() if done else self.fold.pause()
        for worker, text in lines:
            self._append(worker, [text])
        return bool(lines)

    def _append(self, worker: str, texts: list[str]) -> bool:
        node = self._nodes.get(worker, worker)
        for text in texts:
            entry = LogEntry(node, worker, text[:MAX_LINE])
            self.buffers[self.MERGED].append(entry)
            if node in self.buffers:
                self.buffers[node].append(entry)
            self.version += 1
        return bool(texts)

    def clear(self) -> None:
        for buffer in self.buffers.values():
            buffer.clear()
        self.fold.reset()
        self.version += 1


@dataclass
class BandwidthView:
    """The latest matrix, and the test in progress (if any)."""

    matrix: BandwidthMatrix | None = None
    running: bool = False
    done: int = 0
    total: int = 0
    current: str = ""
    error: str = ""

    def begin(self, total: int) -> None:
        self.running, self.done, self.total, self.current, self.error = True, 0, total, "", ""

    def link(self, src: str, dst: str, result: LinkResult | None) -> None:
        if result is None:
            self.current = f"{src} → {dst}"
        else:
            self.done += 1

    def finish(self, matrix: BandwidthMatrix | None, error: str = "") -> None:
        """The test ended: its matrix and error, which may quote the nodes, made visible."""
        self.running, self.current, self.error = False, "", visible(error)
        if matrix is not None:
            self.matrix = visible_fields(matrix)


class ClusterView:
    """Everything on screen, as plain data."""

    def __init__(self, spec: ClusterSpec, experiments: Path = Path("experiments")) -> None:
        self.spec, self.experiments = spec, experiments  # where runs are recorded: a log's whole text
        self.nodes = {node.name: NodeView(node.name, node.host) for node in spec.nodes}
        self.job: JobView | None = None
        self.logs = LogBuffers(self.nodes)
        self.bandwidth = BandwidthView()
        self.alerts: dict[tuple, Alert] = {}  # firing now, in the order they fired (the banner)
        self.notices: collections.deque[tuple[str, str]] = collections.deque(maxlen=NOTICES)  # (text, severity)

    def apply(self, event: object) -> set[str]:
        """Take one event; returns the parts of the screen it changed (NODES, JOB, LOGS, BANDWIDTH, ALERTS).

        What a node said is made visible here, on the way in (remote/nodes/visible.py): a log line's
        text already is what a terminal shows (remote/logs/console.py), and its other fields are names
        homegpu gave."""
        if isinstance(event, LogLine):
            self.logs.add(event)
            return {LOGS}
        event = visible_fields(event)
        if isinstance(event, NodeStatsUpdated):
            if event.node in self.nodes:
                self.nodes[event.node].take_stats(event.stats, event.held_back)
            return {NODES}
        if isinstance(event, (NodeStateChanged, NodeStatsUnavailable)):
            return self._node_event(event)
        if isinstance(event, BandwidthMeasured):
            self.bandwidth.matrix = event.matrix
            return {BANDWIDTH}
        if isinstance(event, (Alert, AlertCommandFailed)):
            return self._alert(event)
        return self._job_event(event)

    def _alert(self, event: Alert | AlertCommandFailed) -> set[str]:
        """The banner holds what fires; a cleared alert leaves it with a toast saying so."""
        if isinstance(event, AlertCommandFailed):
            self.notices.append((f"{event.heading}: {event.reason}", "error"))
        elif event.state is AlertState.FIRING:
            self.alerts[event.key] = event
        elif self.alerts.pop(event.key, None) is not None:
            self.notices.append((f"cleared: {event.message}", "information"))
        return {ALERTS}

    def _node_event(self, event: NodeStateChanged | NodeStatsUnavailable) -> set[str]:
        node = self.nodes.get(event.node)
        if node is None:
            return set()
        if isinstance(event, NodeStatsUnavailable):
            node.stats_problem = event.reason
        else:
            node.state, node.reason, node.fingerprint = event.state, event.reason, event.fingerprint
            if not node.online:
                node.health = HeldBack()  # its figures stay, greyed; a reason is not held across the gap
        return {NODES}

    def _job_event(self, event: object) -> set[str]:
        if isinstance(event, JobStateChanged):
            if self.job is None or self.job.job != event.job or self.job.run_id != event.run_id:
                self._new_job(event.job, event.run_id)
            job = self.job
            job.state, job.generation, job.restarts, job.detail = (
                event.state, event.generation, event.restarts, event.detail)
            logs = self.logs.settle(event.state is JobState.STARTING or event.state.finished)
            return {JOB, LOGS} if logs else {JOB}
        job = self.job
        if job is None or getattr(event, "job", None) != job.job:
            return set()
        if isinstance(event, PreflightResult):
            job.preflight[event.node] = event
        elif isinstance(event, WorkerMetric):
            job.take_metric(event)
            if event.metric.event == "epoch":
                self.logs.epoch(event.worker, epoch_line(event.metric, event.metric.epochs or job.epochs or "?"))
                return {JOB, LOGS}
            if self.logs.end(event.worker):
                return {JOB, LOGS}
        elif isinstance(event, Straggler):
            job.stragglers.add(event.worker)
        elif isinstance(event, WorkerExited):
            job.exits[event.worker] = event
        else:
            return set()
        return {JOB}

    def _new_job(self, name: str, run_id: str) -> None:
        """Another run took the screen: its logs and figures start afresh."""
        self.logs.clear()
        self.logs.fold.log_path = lambda worker: str(RunFolder.of(self.experiments, run_id).log(worker))
        self.job = JobView(name, run_id)
        self.alerts = {key: alert for key, alert in self.alerts.items()  # an earlier run's end is old news
                       if alert.kind not in RUN_ALERTS or alert.run_id == run_id}
