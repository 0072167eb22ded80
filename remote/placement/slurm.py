"""Slurm as a placement (`scheduler = "slurm"`): each run is one Slurm job, submitted on `slurm_login`, whose nodes
the run gets (remote/slurm/allocation.py); Slurm's queue is the queue, and Slurm decides when an entry runs."""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

from homegpu.remote.config import ClusterSpec, JobSpec
from homegpu.remote.events import JobState
from homegpu.remote.nodes import Cluster
from homegpu.remote.placement.base import PlacementError, Say
from homegpu.remote.plan import job_node_specs
from homegpu.remote.slurm import (
    SlurmAllocation, SlurmError, SlurmJob, SlurmLogin, homegpu_jobs, running_run, slurm_login,
)

CHECK_SECONDS = 10.0  # how often a run on Slurm's nodes asks squeue whether Slurm still holds them


class SlurmRunPlacement:
    """The Slurm job that holds one run's nodes (its allocation), once placed."""

    def __init__(self, cluster: Cluster, priority: int, after: Sequence[str], on_placed: Say | None) -> None:
        self.cluster, self.priority, self.after, self.on_placed = cluster, priority, tuple(after), on_placed
        self.allocation: SlurmAllocation | None = None
        self._owned = False  # submitted here, or launched on here: cancelled when the start fails
        self._checked = 0.0  # when squeue was last asked whether Slurm still holds the run's nodes

    async def place(self, job: JobSpec, run_id: str, starting: Say | None, stop: asyncio.Event) -> list[str] | None:
        try:
            slurm = await SlurmLogin.reached(self.cluster.slurm_login(), self.cluster.spec)
            running = running_run(await slurm.queue(), job.name)
            if running is not None:
                self.allocation = SlurmAllocation(slurm, job, running.run_id, running.job_id)
                nodes = running.nodes()
            elif starting is None:
                return None
            else:
                nodes = await self._submit(slurm, job, run_id, starting, stop)
        except SlurmError as exc:
            raise PlacementError(f"{job.name}: {exc}") from None
        self._refuse_unknown(job, nodes)
        return nodes

    def _refuse_unknown(self, job: JobSpec, nodes: list[str]) -> None:
        """Raises PlacementError for a node Slurm allocated that cluster.toml has no [[nodes]] for."""
        spec = self.cluster.spec
        unknown = [name for name in nodes if name not in {node.name for node in spec.nodes}]
        if unknown:
            raise PlacementError(f"Slurm allocated {', '.join(unknown)} to {job.name}, and {spec.source} "
                                 "has no [[nodes]] of that name: add each node named as `sinfo -N` names it")

    async def _submit(self, slurm: SlurmLogin, job: JobSpec, run_id: str, starting: Say,
                      stop: asyncio.Event) -> list[str]:
        """A new Slurm job for the run, its wait said to `starting` with Slurm's reasons; the nodes it got."""
        candidates = job_node_specs(self.cluster.spec, job)
        self.allocation, self._owned = SlurmAllocation(slurm, job, run_id), True
        await self.allocation.submit(len(candidates), nodelist=job.nodes, priority=self.priority, after=self.after)
        if self.on_placed is not None:
            self.on_placed(self.allocation.job_id)
        starting(f"Slurm job {self.allocation.job_id} submitted on {slurm.name} for {len(candidates)} node(s)")
        nodes = await self.allocation.wait_running(starting, stop)
        starting(f"Slurm job {self.allocation.job_id} runs on {', '.join(nodes)}")
        return nodes

    def launching(self) -> None:
        self._owned = self.allocation is not None  # one left by a controller gone: this run's now

    async def cancel(self) -> None:
        if self.allocation is not None and self._owned:
            await self.allocation.cancel()

    async def release(self, state: JobState) -> None:
        """A stopped run's Slurm job is cancelled, one's that succeeded COMPLETED, another's FAILED; ending one that
        ended already does nothing."""
        if self.allocation is None:
            return
        if state is JobState.STOPPED:
            await self.allocation.cancel()
        else:
            await self.allocation.release(succeeded=state is JobState.SUCCEEDED)

    async def ended(self) -> str:
        """Asked of squeue every CHECK_SECONDS."""
        if self.allocation is None or time.monotonic() - self._checked < CHECK_SECONDS:
            return ""
        self._checked = time.monotonic()
        return await self.allocation.ended()

    def unreachable(self, job: JobSpec, problem: str) -> str:
        if self.allocation is None:
            return ""
        return (f"Slurm allocated {', '.join(job.nodes)} to {job.name}, and homegpu cannot reach them all over SSH: "
                f"{problem}")


class SlurmPlacement:
    """Each run a Slurm job: Slurm decides which nodes it gets and when; its queue is Slurm's."""

    places_nodes = True

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec

    def for_run(self, cluster: Cluster, priority: int = 0, after: Sequence[str] = (),
                on_placed: Say | None = None) -> SlurmRunPlacement:
        return SlurmRunPlacement(cluster, priority, after, on_placed)

    async def queued(self) -> list[SlurmJob]:
        try:
            async with slurm_login(self.spec) as login:
                return homegpu_jobs(await login.queue())
        except SlurmError as exc:
            raise PlacementError(str(exc)) from None

    def owns_ids(self, ids: Sequence[str]) -> bool:
        return all(id_.isdigit() for id_ in ids)  # Slurm's job ids; q-N are serve's entries

    async def cancel_queued(self, ids: Sequence[str], say: Say, complain: Say) -> int:
        """scancel each of homegpu's Slurm jobs named; another's, or one Slurm does not know, is said and left."""
        failed = 0
        try:
            async with slurm_login(self.spec) as login:
                ours = {job.job_id: job for job in homegpu_jobs(await login.queue())}
                for id_ in ids:
                    if id_ not in ours:
                        complain(f"{id_} is not one of homegpu's Slurm jobs (`homegpu queue` lists them)")
                        failed += 1
                        continue
                    try:
                        await login.cancel(id_)
                    except SlurmError as exc:
                        complain(str(exc))
                        failed += 1
                        continue
                    say(f"Slurm job {id_} ({ours[id_].job}, run {ours[id_].run_id}) cancelled")
        except SlurmError as exc:
            raise PlacementError(str(exc)) from None
        return failed
