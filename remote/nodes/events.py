"""The typed events every front end consumes, and the hub that fans them out.

remote/ publishes; the TUI and the headless runner subscribe. Events are frozen and carry the node
name and a timestamp, so a consumer never has to ask a session anything.
"""

from __future__ import annotations

import asyncio
import enum
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterable

from homegpu.remote.nodes.stats import NodeStats


class NodeState(str, enum.Enum):
    CONNECTING = "connecting"
    ONLINE = "online"
    OFFLINE = "offline"
    AUTH_FAILED = "auth failed"
    HOST_KEY_UNKNOWN = "host key unknown"
    HOST_KEY_CHANGED = "host key changed"
    ASLEEP = "asleep"  # homegpu put it to sleep (nodes/asleep.py): not a fault, woken when work needs it

    @property
    def needs_user(self) -> bool:
        """States that retrying alone cannot fix: the user must act (trust, fix keys)."""
        return self in (NodeState.AUTH_FAILED, NodeState.HOST_KEY_UNKNOWN, NodeState.HOST_KEY_CHANGED)


@dataclass(frozen=True)
class NodeStateChanged:
    node: str
    state: NodeState
    reason: str = ""
    fingerprint: str = ""
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class NodeStatsUpdated:
    node: str
    stats: NodeStats
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class NodeStatsUnavailable:
    """The node is online but its stats agent could not run (no python3, say)."""

    node: str
    reason: str
    at: float = field(default_factory=time.time)


class JobState(str, enum.Enum):
    PREFLIGHT = "preflight"
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)


@dataclass(frozen=True)
class JobStateChanged:
    job: str
    run_id: str
    state: JobState
    generation: int
    restarts: int
    detail: str = ""
    at: float = field(default_factory=time.time)
    regroup: str = ""  # who trains changed (jobs/fewer.py): SHRUNK, a machine left for good, or REJOINED


SHRUNK, REJOINED = "shrunk", "rejoined"  # JobStateChanged.regroup


@dataclass(frozen=True)
class QueueRunChanged:
    """A queued run moved on (serve's queue runner says it): `state` is "started" (its launch begins),
    "succeeded", "failed" or "cancelled", with `reason` saying why where there is a why. `run_id` is ""
    for an entry cancelled before it started; `settings`: the entry's `--set KEY=VALUE`s."""

    entry_id: str
    job: str
    run_id: str
    state: str
    reason: str = ""
    at: float = field(default_factory=time.time)
    settings: tuple[str, ...] = ()


@dataclass(frozen=True)
class PreflightResult:
    """One node's preflight: empty `problems` means ready; `warnings` do not stop the launch
    (another process holding much of a GPU the job will use, say)."""

    job: str
    node: str
    problems: tuple[str, ...]
    gpus: str = ""
    warnings: tuple[str, ...] = ()
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class WorkerExited:
    job: str
    run_id: str
    worker: str
    generation: int
    exit_status: int | None
    meaning: str
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Straggler:
    """A worker clearly slower than the others (its rate against the median of the rest's).

    `examples_per_sec` and `others_median` are in `unit`: examples/s, or steps/s for a script whose
    batch size homegpu does not know (Keras prints steps). `held_back`: what holds the worker's GPUs
    back as its node's stats showed it then (nodes/health.py's sentences), where anything does."""

    job: str
    run_id: str
    worker: str
    examples_per_sec: float
    others_median: float
    at: float = field(default_factory=time.time)
    unit: str = "examples/s"
    epoch: int | None = None  # the epoch whose rates showed it
    held_back: tuple[str, ...] = ()

    @property
    def cause_text(self) -> str:
        """". Held back: GPU 0 thermal slowdown ...", to follow its figures; "" where nothing was seen."""
        return ". Held back: " + ". ".join(self.held_back) if self.held_back else ""


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


class EventHub:
    """Fans each published event out to every subscriber's own queue.

    Publishing never blocks: a subscriber that stops reading only grows its own queue, up to
    `max_queue`, after which its oldest events are dropped (stats are superseded every second).
    """

    def __init__(self, max_queue: int = 10_000) -> None:
        self._queues: list[asyncio.Queue] = []
        self._max_queue = max_queue
        self._derivers: list[Callable[[object], Iterable[object]]] = []

    def publish(self, event: object) -> None:
        for queue in self._queues:
            if queue.full():
                queue.get_nowait()
                queue.dropped += 1
            queue.put_nowait(event)
        for derive in self._derivers:
            for derived in derive(event):
                self.publish(derived)

    def derive(self, deriver: Callable[[object], Iterable[object]]) -> None:
        """Call `deriver` with every event as it is published, and publish what it returns right after.

        Derived events (alerts) follow their cause in every subscriber's stream, before any later
        event, so the timeline records a run's last alert before the run's recorder closes. A
        deriver runs on every event, floods of log lines included: it must be cheap, and must not
        derive from what it derived itself."""
        self._derivers.append(deriver)

    def underive(self, deriver: Callable[[object], Iterable[object]]) -> None:
        if deriver in self._derivers:
            self._derivers.remove(deriver)

    def subscribe(self) -> "Subscription":
        queue = _Queue(self._max_queue)
        self._queues.append(queue)
        return Subscription(self, queue)

    def _unsubscribe(self, queue: asyncio.Queue) -> None:
        if queue in self._queues:
            self._queues.remove(queue)


class _Queue(asyncio.Queue):
    """A subscriber's queue, counting the events it lost to a full queue."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.dropped = 0


class Subscription:
    """An async iterator over events published after it was created; close() to stop."""

    def __init__(self, hub: EventHub, queue: _Queue) -> None:
        self._hub, self._queue = hub, queue

    @property
    def dropped(self) -> int:
        """Events this subscriber lost because it read slower than they came (a flood of output)."""
        return self._queue.dropped

    def __aiter__(self) -> AsyncIterator[object]:
        return self

    async def __anext__(self) -> object:
        return await self._queue.get()

    async def get(self, timeout: float | None = None) -> object:
        async with asyncio.timeout(timeout):  # not wait_for, which can lose a cancel (waiting.py)
            return await self._queue.get()

    def drain(self, limit: int) -> list[object]:
        """Up to `limit` events already waiting, without waiting for more (to handle a flood in batches)."""
        events = []
        while len(events) < limit and not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events

    def close(self) -> None:
        self._hub._unsubscribe(self._queue)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
