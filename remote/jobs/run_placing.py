"""Where a run is placed: its nodes asked of the cluster's placement (remote/placement/: at once on homegpu's own
scheduler, a Slurm job's on Slurm), its asleep nodes woken, its runtimes opened and its workers laid out on their GPUs;
what holds its nodes let go when it ends."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from homegpu.remote.events import JobState
from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.nodes import connect_wait
from homegpu.remote.placement import PlacementError
from homegpu.remote.plan import job_node_specs, worker_slots
from homegpu.remote.sleep_wake import WakeFailed, wake_asleep


class RunPlacing:
    """A run's nodes: placed, woken and opened once (open()), let go at its end (release())."""

    def __init__(self, run: RunState) -> None:
        self.run = run

    async def open(self, timeout: float | None, waking: Callable[[str], None] | None) -> None:
        """Place the run, wake its asleep nodes where work is to start (`waking`), open a runtime for each node and
        lay its workers out; what the placement took is let go again when a step fails.

        Raises:
            LaunchError: a node is not reached (or not woken), or the plan refuses the layout.
        """
        try:
            await self._open(timeout, waking)
        except BaseException:
            await self.run.placement.cancel()
            raise

    async def _open(self, timeout: float | None, waking: Callable[[str], None] | None) -> None:
        run = self.run
        try:
            placed = await run.placement.place(run.job, run.run_id, waking, run.stop_requested)
        except PlacementError as exc:
            raise LaunchError(str(exc)) from None
        if placed is not None:
            self._narrow_to(placed)
        if waking is not None:
            await self._wake_asleep_nodes(waking)
        nodes = await self._open_nodes(timeout)
        layout = run.layout()  # now connected: the nodes' addresses and GPUs are known
        run.plan, run.slots = layout.plan, layout.slots
        nodes.slots = list(run.slots)
        run.nodes = nodes
        run.first_workers = len(run.slots)

    async def _open_nodes(self, timeout: float | None) -> JobRuntimes:
        """The job's runtimes; a node homegpu cannot reach is said in the placement's words, before any start."""
        try:
            return await JobRuntimes.open(self.run.cluster, self.run.job, timeout,
                                          lambda line: self.run.publish(self.run.state, line))
        except LaunchError as exc:
            if not (words := self.run.placement.unreachable(self.run.job, str(exc))):
                raise
            raise LaunchError(words) from None

    def _narrow_to(self, placed: list[str]) -> None:
        """The run's job on the nodes the placement gave it (each one of cluster.toml's), in the job's order (the
        first is the chief)."""
        run, spec = self.run, self.run.cluster.spec
        known = [node.name for node in spec.nodes]
        order = [node.name for node in job_node_specs(spec, run.job)] + known
        run.job = replace(run.job, nodes=tuple(sorted(placed, key=order.index)))
        run.slots = worker_slots(spec, run.job)
        run.every_node = list(run.job.nodes)

    async def _wake_asleep_nodes(self, waking: Callable[[str], None]) -> None:
        """Wake the job's nodes that homegpu put to sleep, saying so (nodes/asleep.py, power/waking.py).

        Raises:
            LaunchError: a node did not wake, naming it and the likely causes.
        """
        cluster = self.run.cluster
        names = [node.name for node in job_node_specs(cluster.spec, self.run.job)]
        await cluster.wait_settled(connect_wait(cluster.spec, 2), names)  # an asleep node is known by then
        try:
            await wake_asleep(cluster, names, waking)
        except WakeFailed as exc:
            raise LaunchError(str(exc)) from None

    async def release(self, state: JobState) -> None:
        """Let go of what holds the run's nodes as the run ended in `state` (a Slurm job: COMPLETED, FAILED or
        cancelled); whichever controller saw the end does it."""
        await self.run.placement.release(state)

    async def ended(self) -> str:
        """Why the placement took the run's nodes back while it ran ("" while it holds them)."""
        return await self.run.placement.ended()
