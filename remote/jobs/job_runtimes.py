"""Runs as they exist on the nodes: find, list, stop and read the logs of runs any homegpu started.

The nodes keep every run's state (pid files, container labels), so these work from any terminal.
A JobRuntimes holds one runtime per node of a job; `homegpu jobs`, `logs` and `stop`, the TUI and a
JobRun all reach a job's workers through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Callable, Iterable, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.events import JobState, LogLine, NodeState
from homegpu.remote.logs import LogTail
from homegpu.remote.nodes import LOGIN_TIMEOUT_S, NODE_GONE, Cluster, NodeSession, cause, connect_wait, wait_set
from homegpu.remote.plan import WorkerSlot, job_node_specs, lay_out
from homegpu.remote.runtimes import Runtime, RuntimeError_, WorkerStatus, expand_path, make_runtime

WAIT_BACK_POLL_SECONDS = 1.0
# A folder in the run's dir on its nodes: `homegpu stop` from another terminal made it, so the `homegpu run`
# that watches the run takes its workers' ends for the stop they are, not a failure to restart from.
STOP_MARK = "stop-requested"
_IS_DIR = "import os, sys; print(os.path.isdir(sys.argv[1]))"
STOP_MARK_TIMEOUT = 5.0  # seconds: the mark is a stat on a node that answers at once when it is there


class LaunchError(Exception):
    """The run could not start (or its nodes could not be reached); nothing of it is left running.
    The message names node and fix."""


async def open_runtime(cluster: Cluster, node: NodeSession, timeout: float,
                       say: Callable[[str], None] | None = None) -> tuple[Runtime, str]:
    """The node's runtime and its expanded work dir, once it is online. `say`: a line when its login keeps the run
    waiting (up to a minute: pyenv's own wait on a stale lock), so that the wait is not a silent one.

    Raises:
        LaunchError: the node is not online within `timeout`, or its home dir cannot be read.
    """
    try:
        await node.wait_online(timeout)
    except asyncio.TimeoutError:
        raise LaunchError(f"{node.name} is {node.state.value}: {node.reason or 'no answer'}") from None
    if node.streams_stats:  # the first stats say whether the node has GPUs to hand to containers
        first_stats = 3 * cluster.spec.stats_interval + 5
        with contextlib.suppress(asyncio.TimeoutError):
            await node.wait_for(lambda n: n.latest is not None, first_stats)
        waited = node.login_waiting
        if node.latest is None and waited is not None:  # a slow login (pyenv's 60 s on a stale lock): its end
            more = max(LOGIN_TIMEOUT_S - waited, 0) + first_stats
            if say is not None and node.waiting_on:
                say(f"waiting up to {more:.0f} s more for {node.name}: {node.waiting_on}")
            with contextlib.suppress(asyncio.TimeoutError):
                await node.wait_for(lambda n: n.latest is not None, more)
        if node.latest is None and node.waiting_on:  # stuck past pyenv's own 60 s: named, not "GPUs not known"
            raise LaunchError(f"{node.name}: {node.waiting_on}")
    try:
        work = await expand_path(node, cluster.spec.work_dir_of(node.spec))
    except (RuntimeError_, *NODE_GONE) as exc:
        raise LaunchError(f"{node.name}: {exc}") from None
    return make_runtime(node, f"{work}/runs"), work


class JobRuntimes:
    """A job's worker slots with the runtime of each one's node. Make one with JobRuntimes.open."""

    def __init__(self, job: JobSpec, slots: Sequence[WorkerSlot], runtimes: dict[str, Runtime],
                 work_dirs: dict[str, str]) -> None:
        self.job, self.slots = job, list(slots)
        self.runtimes = runtimes  # node name -> runtime
        self.work_dirs = work_dirs  # node name -> expanded work dir

    @classmethod
    async def open(cls, cluster: Cluster, job: JobSpec, timeout: float | None = None,
                   say: Callable[[str], None] | None = None) -> "JobRuntimes":
        """Wait for the job's nodes and make a runtime for each; `say`: a line while a login keeps them waiting.

        Raises:
            LaunchError: naming every node that could not be reached.
        """
        timeout = timeout or connect_wait(cluster.spec, 5)
        nodes = [cluster.node(node.name) for node in job_node_specs(cluster.spec, job)]
        results = await asyncio.gather(*(open_runtime(cluster, node, timeout, say) for node in nodes),
                                       return_exceptions=True)
        problems = [str(r) for r in results if isinstance(r, BaseException)]
        if problems:
            raise LaunchError("; ".join(problems))
        # laid out as a run would, once every node has sent stats (a "per-gpu" node: a worker per GPU)
        layout = lay_out(cluster.spec, job, {node.name: node.latest for node in nodes}, cluster.addresses())
        return cls(job, layout.slots, {node.name: r[0] for node, r in zip(nodes, results)},
                   {node.name: r[1] for node, r in zip(nodes, results)})

    def keep(self, job: JobSpec, slots: Sequence[WorkerSlot]) -> None:
        """Hold only `job`'s nodes and `slots` from now on: a run that went on without some (jobs/fewer.py)."""
        self.job, self.slots = job, list(slots)
        self.runtimes = {name: runtime for name, runtime in self.runtimes.items() if name in job.nodes}

    def add(self, opened: dict[str, tuple[Runtime, str]]) -> None:
        """Hold these nodes' (runtime, work dir) too (open_runtime's): nodes that rejoin a run."""
        for name, (runtime, work_dir) in opened.items():
            self.runtimes[name], self.work_dirs[name] = runtime, work_dir

    def runtime(self, slot: WorkerSlot) -> Runtime:
        return self.runtimes[slot.node.name]

    def away(self) -> list[NodeSession]:
        """The job's nodes that are not online right now (rebooting, cut off, refusing us)."""
        return [runtime.node for runtime in self.runtimes.values() if runtime.node.state is not NodeState.ONLINE]

    async def wait_back(self, timeout: float, stop: asyncio.Event) -> str:
        """Wait for every node of the job to be online, at most `timeout` seconds or until `stop` is
        set; returns why they are not all back ("" when they are, or when stopped)."""
        deadline = time.monotonic() + timeout
        while (away := self.away()) and not stop.is_set():
            stuck = [node for node in away if node.state.needs_user]  # retrying cannot fix these
            if stuck or time.monotonic() >= deadline:
                return "; ".join(f"{node.name} did not come back within {timeout:g} s ({node.state.value}: "
                                 f"{node.reason or 'no answer'})" for node in stuck or away)
            await wait_set(stop, WAIT_BACK_POLL_SECONDS)
        return ""

    async def find(self, running_only: bool = True, run_id: str = "") -> tuple[str, int] | None:
        """Returns: (run id, generation) of the newest run of the job on its nodes (or of run `run_id` alone) that
        still runs (or, with running_only=False, that ran), else None. Unreachable nodes are left out."""
        runs = await self.runs(running_only)
        return next((run for run in runs if run[0] == (run_id or run[0])), None)

    async def runs(self, running_only: bool = True) -> list[tuple[str, int]]:
        """(run id, latest generation) of each run of the job its nodes list that still runs (or, with
        running_only=False, that ran), newest first: several where runs of the job share cards at once (the queue's
        gpu_memory). Unreachable nodes are left out."""
        found = await asyncio.gather(*(r.list_workers() for r in self.runtimes.values()), return_exceptions=True)
        latest: dict[str, int] = {}
        for worker in (w for group in found if not isinstance(group, BaseException) for w in group):
            if worker.job == self.job.name and (worker.running or not running_only):
                latest[worker.run_id] = max(latest.get(worker.run_id, 1), worker.generation or 1)
        return sorted(latest.items(), reverse=True)

    async def ended_state(self, run_id: str) -> JobState:
        """How run `run_id` ended as its workers' exit statuses tell it: SUCCEEDED when every worker found
        exited 0, else FAILED (none found, one unreachable node's workers left out)."""
        try:
            found = await asyncio.gather(*(r.list_workers() for r in self.runtimes.values()))
        except (*NODE_GONE, asyncio.TimeoutError):
            found = []
        statuses = [w.exit_status for group in found for w in group if w.run_id == run_id]
        return JobState.SUCCEEDED if statuses and all(s == 0 for s in statuses) else JobState.FAILED

    async def stop(self, run_id: str, slots: Sequence[WorkerSlot] | None = None) -> list[WorkerStatus | BaseException]:
        """Stop every worker of `run_id` (or of `slots`): TERM, a grace period, then KILL.

        Returns:
            Each slot's status once stopped, or the exception that stopping it raised, in order.
        """
        slots = self.slots if slots is None else slots
        return list(await asyncio.gather(*(self.runtime(s).stop(run_id, s.label) for s in slots),
                                         return_exceptions=True))

    async def mark_stopped(self, run_id: str) -> None:
        """Leave STOP_MARK in the run's dir on every node that can be reached (before stopping its workers)."""
        await asyncio.gather(*(r.node.makedirs(f"{r.run_dir(run_id)}/{STOP_MARK}") for r in self.runtimes.values()),
                             return_exceptions=True)

    @staticmethod
    async def stop_marked(run_id: str, runtimes: Iterable[Runtime]) -> bool:
        """Whether `homegpu stop` marked the run (mark_stopped) on one of `runtimes`' nodes (those whose workers
        ended: a stop ends them all) that is online; asked of them at once and briefly, since a restart waits
        for the answer."""
        async def marked(runtime: Runtime) -> bool:
            node = runtime.node
            result = await node.run([node.spec.python, "-c", _IS_DIR, f"{runtime.run_dir(run_id)}/{STOP_MARK}"],
                                    timeout=STOP_MARK_TIMEOUT)
            return result.stdout.strip() == "True"

        online = [runtime for runtime in runtimes if runtime.node.state is NodeState.ONLINE]
        found = await asyncio.gather(*map(marked, online), return_exceptions=True)
        return any(answer is True for answer in found)

    def slots_on(self, node: str | None) -> list[WorkerSlot]:
        """The job's worker slots on `node` (a node name or a worker label; None: every slot).

        Raises:
            LookupError: no worker of the job matches `node`.
        """
        slots = [s for s in self.slots if node in (None, s.label, s.node.name)]
        if not slots:
            raise LookupError(f"{self.job.name} has no worker on node {node!r}")
        return slots

    def tails(self, run_id: str, generation: int, slots: Sequence[WorkerSlot],
              on_line: Callable[[LogLine], None], follow: bool = True) -> list[LogTail]:
        """Returns: started LogTails of each slot's output in that generation (LogLine.worker: its label)."""
        return [self.runtime(s).tail(run_id, s.label, generation, follow=follow, on_line=on_line,
                                     worker=s.label).start()
                for s in slots]


async def list_workers(cluster: Cluster) -> list[tuple[str, list[WorkerStatus] | LaunchError]]:
    """Every worker on every node of the cluster, running or not; one node's failure is its own.

    Returns:
        (node name, its workers) per node, or (node name, a LaunchError saying why) for a node not
        reached or whose runtime could not list its workers.
    """
    async def one(node: NodeSession) -> list[WorkerStatus] | LaunchError:
        try:
            runtime, _ = await open_runtime(cluster, node, connect_wait(cluster.spec, 5))
            return await runtime.list_workers()
        except LaunchError as exc:
            return exc
        except (RuntimeError_, *NODE_GONE) as exc:
            return LaunchError(cause(exc))
    nodes = list(cluster.nodes.values())
    return list(zip((n.name for n in nodes), await asyncio.gather(*(one(n) for n in nodes))))
