"""The runs of the cluster's jobs that `serve` did not start (a `homegpu run` in someone's terminal, a
detached run), followed read-only: their progress reaches serve's hub as if serve ran them.

Every FIND_SECONDS each job's nodes are asked for a running run (the same listing `homegpu jobs` reads).
A run found is announced (JobStateChanged RUNNING; its restarts are its generation - 1) and its workers'
logs are tailed: every metric line becomes a WorkerMetric. A new generation (a restart) is tailed anew.
When the run is gone its end is announced from its workers' exit statuses. Nothing is started, stopped
or written on a node: the run belongs to whoever launched it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterable

from homegpu.remote.config import JobSpec
from homegpu.remote.events import JobState, JobStateChanged, LogLine, WorkerMetric
from homegpu.remote.jobs import JobRuntimes, LaunchError
from homegpu.remote.logs import LogTail
from homegpu.remote.nodes import NODE_GONE, Cluster

FIND_SECONDS = 10.0
FOLLOWED = "followed by homegpu serve"


@dataclass
class _Followed:
    run_id: str
    generation: int
    tails: list[LogTail] = field(default_factory=list)


class RunFollower:
    """Follows the running runs of `jobs` on `cluster`; start() it, close() it.

    Args:
        jobs: the jobs to follow; None: those of `cluster.spec` at each look (serve reads an edited file again).
        ours: whether serve runs that run id itself (the queue's runs): those are not followed twice.
    """

    def __init__(self, cluster: Cluster, jobs: Iterable[JobSpec] | None = None, find_seconds: float = FIND_SECONDS,
                 ours: Callable[[str], bool] = lambda run_id: False) -> None:
        self.cluster, self.find_seconds, self.ours = cluster, find_seconds, ours
        self._jobs = None if jobs is None else list(jobs)
        self._nodes: dict[str, JobRuntimes] = {}
        self._followed: dict[str, _Followed] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> RunFollower:
        self._task = asyncio.create_task(self._loop())
        return self

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for followed in self._followed.values():
            await _stop(followed.tails)

    async def _loop(self) -> None:
        while True:
            jobs = self._jobs if self._jobs is not None else self.cluster.spec.jobs.values()
            await asyncio.gather(*(self.look(job) for job in jobs))
            await asyncio.sleep(self.find_seconds)

    async def look(self, job: JobSpec) -> None:
        """One look at `job`'s nodes: follow a run that appeared or restarted, end one that is gone.
        A node that does not answer changes nothing (its run is looked for again next time)."""
        try:
            nodes = self._nodes.get(job.name) or await JobRuntimes.open(self.cluster, job, timeout=5)
            self._nodes[job.name] = nodes
            found = await nodes.find(running_only=True)
        except (LaunchError, *NODE_GONE):
            return
        if found and self.ours(found[0]):
            found = None
        current = self._followed.get(job.name)
        if current and found == (current.run_id, current.generation):
            return
        if current:
            await _stop(current.tails)
            if found is None or found[0] != current.run_id:
                del self._followed[job.name]
                await self._announce_end(job, nodes, current)
        if found:
            self._follow(job, nodes, *found)

    def _follow(self, job: JobSpec, nodes: JobRuntimes, run_id: str, generation: int) -> None:
        index = {slot.label: slot.index for slot in nodes.slots}

        def take(line: LogLine) -> None:
            if line.metric is not None:
                self.cluster.hub.publish(WorkerMetric(job.name, run_id, line.worker, index.get(line.worker, 0),
                                                      line.metric))

        self.cluster.hub.publish(JobStateChanged(job.name, run_id, JobState.RUNNING, generation, generation - 1,
                                                 FOLLOWED))
        tails = nodes.tails(run_id, generation, nodes.slots, on_line=take, follow=True)
        self._followed[job.name] = _Followed(run_id, generation, tails)

    async def _announce_end(self, job: JobSpec, nodes: JobRuntimes, ended: _Followed) -> None:
        """The run's end as its workers' exit statuses tell it (all 0: succeeded)."""
        state = await nodes.ended_state(ended.run_id)
        self.cluster.hub.publish(JobStateChanged(job.name, ended.run_id, state, ended.generation,
                                                 ended.generation - 1, FOLLOWED))


async def _stop(tails: list[LogTail]) -> None:
    await asyncio.gather(*(tail.stop() for tail in tails), return_exceptions=True)
