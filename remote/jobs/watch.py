"""What the watch loop knows and judges of each worker: its track, polling them all (one round trip
per node, WorkerExited published once one ends), and the failure or stall that ends a generation.

A poll starts a process on every node, so the loop polls when a worker's log says it ended (nudge()) and
otherwise every QUIET_POLL_SECONDS, for a worker that vanished without a word; its other checks stay each second.

A worker killed by a signal is named before one that failed by itself: when one worker is killed,
its peers fail too, and the kill is the cause. A worker that prints nothing for the job's
stall_timeout has stalled (the watchdog); its node being unreachable does not stop that clock.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.events import NO_METRIC, EventHub, Metric, WorkerExited
from homegpu.remote.jobs.failure import WorkerEnd
from homegpu.remote.jobs.launch_plan import classify_exit
from homegpu.remote.jobs.resume_check import FirstEpochs
from homegpu.remote.logs import EpochNumbers, LogTail, TracebackReader
from homegpu.remote.nodes import NODE_GONE
from homegpu.remote.plan import WorkerSlot
from homegpu.remote.runtimes import Runtime, RuntimeError_, WorkerStatus

ENDED = ("exited", "vanished")
LAST_LINES = 60  # of a worker's log, to tell why it ended (a traceback, a full disk)
POLL_TIMEOUT_SECONDS = 10.0  # a node whose connection died silently must not hold up the others' polls
QUIET_POLL_SECONDS = 5.0  # between polls while no worker's log says it ended
# The line a process worker's supervisor ends its log with (node_side/scripts/worker_process.py)
EXIT_NOTE = re.compile(r"^=== homegpu: .* exited with status -?\d+ ===$")


@dataclass
class WorkerTrack:
    """What the controller knows of one worker right now."""

    slot: WorkerSlot
    runtime: Runtime
    last_activity: float = field(default_factory=time.monotonic)
    status: WorkerStatus | None = None
    tail: LogTail | None = None
    last_metric: Metric = NO_METRIC  # the latest figure of each kind, from its epoch and end lines
    progressed: bool = False  # this generation trained (a step, epoch or end metric line came)
    first_epochs: FirstEpochs = field(default_factory=FirstEpochs)  # what this generation's first lines said
    code_dir: str = ""  # the job's code as the worker sees it (NodePaths.code_dir): where its errors are named
    # Its last traceback this generation, read as each line came: the header of an error whose message
    # is hundreds of lines is far above last_lines().
    tracebacks: TracebackReader = field(default_factory=TracebackReader)
    # Whether its script counts epochs from 0 or 1, told by its first epoch line: a resumed generation's first
    # line (`Epoch 3`) cannot tell.
    epoch_numbers: EpochNumbers = field(default_factory=EpochNumbers)

    @property
    def label(self) -> str:
        return self.slot.label

    def last_lines(self, count: int = LAST_LINES) -> tuple[str, ...]:
        """The worker's last `count` log lines, oldest first (what its tail still holds)."""
        return tuple(line.text for line in self.tail.lines)[-count:] if self.tail else ()

    @property
    def ended(self) -> bool:
        return self.status is not None and self.status.state in ENDED


class WorkerWatch:
    """Polls one run's workers (`tracks`) and notes each status in its track."""

    def __init__(self, job: str, hub: EventHub, tracks: dict[str, WorkerTrack]) -> None:
        self.job, self.hub, self.tracks = job, hub, tracks
        self._polled_at = -math.inf
        self._nudged = False

    def nudge(self) -> None:
        """A worker may have ended (its log said so): the next check polls."""
        self._nudged = True

    async def check(self, run_id: str, generation: int, stall_timeout: float) -> str | None:
        """Poll every worker when nudged or QUIET_POLL_SECONDS after the last poll; the failure or stall that ends
        this generation, else None. A node that does not answer right now fails nothing by itself; any other error
        is raised."""
        if self._nudged or time.monotonic() - self._polled_at >= QUIET_POLL_SECONDS:
            for track, status in zip(*await self._poll_all(run_id)):
                if isinstance(status, BaseException):
                    if not isinstance(status, (*NODE_GONE, RuntimeError_, asyncio.TimeoutError)):
                        raise status
                else:  # node unreachable right now: the stall clock keeps running
                    self.note(track, status, run_id, generation)
        return generation_failure(_by_runtime(self.tracks.values()), stall_timeout, time.monotonic())

    async def poll(self, run_id: str, generation: int) -> None:
        """Poll every worker and note the statuses that came back."""
        for track, status in zip(*await self._poll_all(run_id)):
            if isinstance(status, WorkerStatus):
                self.note(track, status, run_id, generation)

    async def _poll_all(self, run_id: str) -> tuple[list[WorkerTrack], list[WorkerStatus | BaseException]]:
        self._nudged = False  # a nudge while the poll runs is for the next one
        self._polled_at = time.monotonic()
        return await _poll_workers(self.tracks.values(), run_id)

    def note(self, track: WorkerTrack, status: WorkerStatus, run_id: str, generation: int) -> None:
        if status.generation not in (None, generation):
            return  # a previous generation's leftovers
        changed = track.status is None or track.status.state != status.state
        track.status = status
        if changed and status.state in ENDED:
            self.hub.publish(WorkerExited(self.job, run_id, track.label, generation,
                                          status.exit_status, classify_exit(status.exit_status)))


async def _poll_workers(tracks: Iterable[WorkerTrack], run_id: str
                       ) -> tuple[list[WorkerTrack], list[WorkerStatus | BaseException]]:
    """Every worker's status, one round trip per node; a node's failure stands for each of its workers."""
    groups = _runtime_groups(tracks)
    replies = await asyncio.gather(*(asyncio.wait_for(group[0].runtime.statuses(run_id, [t.label for t in group]),
                                                      POLL_TIMEOUT_SECONDS)
                                     for group in groups), return_exceptions=True)
    polled, statuses = [], []
    for group, reply in zip(groups, replies):
        polled += group
        statuses += [reply] * len(group) if isinstance(reply, BaseException) else reply
    return polled, statuses


def _runtime_groups(tracks: Iterable[WorkerTrack]) -> list[list[WorkerTrack]]:
    """The tracks by runtime (node), in the order their runtimes first come."""
    by_runtime: dict[Runtime, list[WorkerTrack]] = {}
    for track in tracks:
        by_runtime.setdefault(track.runtime, []).append(track)
    return list(by_runtime.values())


def _by_runtime(tracks: Iterable[WorkerTrack]) -> list[WorkerTrack]:
    """The tracks in the order a poll returns them."""
    return [track for group in _runtime_groups(tracks) for track in group]


def generation_failure(tracks: Sequence[WorkerTrack], stall_timeout: float, now: float) -> str | None:
    """What ends this generation, from the tracks' latest statuses: a failed worker (a killed one
    first), else one silent for `stall_timeout` seconds; None while the workers are fine."""
    failed = [t for t in tracks if t.ended and t.status.exit_status != 0]
    if failed:
        cause = min(failed, key=lambda t: not _killed(t.status.exit_status))
        return f"{cause.label}: {classify_exit(cause.status.exit_status)}"
    for track in tracks:
        finished = track.status is not None and track.status.state == "exited"
        if not finished and now - track.last_activity > stall_timeout:
            return f"{track.label}: no progress for {stall_timeout:g}s (stalled)"
    return None


def all_succeeded(tracks: Iterable[WorkerTrack]) -> bool:
    return all(t.status and t.status.state == "exited" and t.status.exit_status == 0 for t in tracks)


def ended_runtimes(tracks: Iterable[WorkerTrack]) -> list[Runtime]:
    """The runtimes of the workers that exited (their nodes answered with an exit status), each once."""
    return list(dict.fromkeys(t.runtime for t in tracks if t.status and t.status.state == "exited"))


def worker_ends(tracks: Iterable[WorkerTrack]) -> list[WorkerEnd]:
    """How each worker ended, with its last traceback and log lines, for the script-error verdict
    (remote/jobs/failure.py)."""
    return [WorkerEnd(t.label, t.status.exit_status if t.status else None, progressed=t.progressed,
                      last_lines=t.last_lines(), stopped=not t.ended, traceback=t.tracebacks.last,
                      code_dir=t.code_dir)
            for t in tracks]


def retry_is_pointless(job: JobSpec, tracks: Iterable[WorkerTrack]) -> bool:
    """The built-in trainer exits 2 (bad options, TF_CONFIG or data) or 3 (backups disagree)
    for what a restart cannot fix."""
    return job.uses_trainer and any(t.status and t.status.exit_status in (2, 3) for t in tracks)


def _killed(exit_status: int | None) -> bool:
    """Ended by a signal: a negative status (a process), or 128 + N (a container's shell)."""
    return exit_status is not None and (exit_status < 0 or 128 < exit_status < 160)
