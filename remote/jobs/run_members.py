"""Who is in a run: it goes on without a node that did not come back where the job's min_workers allows, and takes
a lost node back once it is online again (jobs/fewer.py says how the job, its batch and the lines change)."""

from __future__ import annotations

from dataclasses import replace

from homegpu.remote.config import JobSpec
from homegpu.remote.events import REJOINED, SHRUNK, JobState, NodeState
from homegpu.remote.jobs.fewer import (
    FewerWorkersRefused, batch_for, check_enough, going_on_line, job_with, job_without, rejoining_line,
)
from homegpu.remote.jobs.job_runtimes import LaunchError, open_runtime
from homegpu.remote.jobs.run_backups import RunBackups
from homegpu.remote.jobs.run_generation import Generations
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.nodes import NodeSession, connect_wait


class Members:
    """The run's nodes as they leave and come back: its job, layout, tracks and lock follow them."""

    def __init__(self, run: RunState, generations: Generations, backups: RunBackups) -> None:
        self.run, self.generations, self.backups = run, generations, backups
        self._back_since_epoch: int | None = None  # the chief's epoch when a lost node was first seen back

    async def go_on_without(self, gone: str) -> None:
        """Go on with the nodes left where the job's min_workers allows: the run's job, layout and tracks become
        theirs, the first of them the chief (its run lock moves there), and a line says so.

        Raises:
            FewerWorkersRefused: why the run cannot go on (too few left, a batch that does not split, the plan).
        """
        run = self.run
        lost = [(node.name, node.state.value) for node in run.nodes.away()]
        job = job_without(run.job, run.every_node, [name for name, _ in lost])
        try:
            words = await self._regroup(job, gone)
        except LaunchError as exc:
            raise FewerWorkersRefused(f"{gone}; the nodes left cannot take the run: {exc}") from None
        run.restarts -= 1  # a machine that left is no fault of the run's: it spends no restart
        self._say(going_on_line(lost, run.job.reconnect_timeout, job.nodes, self.backups.resume_epoch(), words),
                  SHRUNK)

    def returned(self) -> list[str]:
        """The nodes the run went on without that are online again, in the job's order. A node back resumes from the
        same backup or checkpoint as the others: the chief's copy is put onto it (RunBackups.restore)."""
        run = self.run
        lost = {track.slot.node.name for track in run.lost_tracks}
        return [name for name in run.every_node if name in lost and _usable(run.cluster.node(name))]

    async def take_back(self, back: list[str]) -> str | None:
        """Lay the run out again with the nodes in `back` (their runtimes opened afresh, their tracks back), saying
        so; why they cannot rejoin (the run goes on without them then)."""
        run = self.run
        try:
            opened = {name: await open_runtime(run.cluster, run.cluster.node(name), connect_wait(run.cluster.spec, 1))
                      for name in back}
            run.nodes.add(opened)
            job = job_with(run.job, run.every_node, back)
            words = await self._regroup(job, "")
        except (LaunchError, FewerWorkersRefused) as exc:
            return f"{', '.join(back)} cannot rejoin: {exc}"
        await run.nodes.stop(run.run_id, [slot for slot in run.slots if slot.node.name in back])  # a cut-off
        # node's worker may still run
        self._say(rejoining_line(back, job.nodes, self.backups.resume_epoch(), words), REJOINED)
        return None

    async def rejoin_at_epoch_end(self) -> str | None:
        """With `rejoin` (the default), restart everyone with the lost nodes that are back once the chief finishes
        the epoch it was in when they came back; why the next generation could not start, when it could not."""
        run = self.run
        back = self.returned() if run.job.rejoin else []
        epoch = run.chief_track().last_metric.epoch or 0
        if not back:
            self._back_since_epoch = None
            return None
        if self._back_since_epoch is None:
            self._back_since_epoch = epoch
        if epoch <= self._back_since_epoch:
            return None
        self._back_since_epoch = None
        await self.generations.end()
        if problem := await self.take_back(back):
            run.publish(JobState.RESTARTING, problem)
        return await self.generations.start_next()

    def _say(self, line: str, regroup: str) -> None:
        self.run.publish(JobState.RESTARTING, line, regroup)
        if self.run.on_regroup is not None:
            self.run.on_regroup(line)

    async def _regroup(self, job: JobSpec, gone: str) -> str:
        """Make `job` (the run's on other nodes) the run's: its layout, batch (on_fewer_workers), tracks and run lock
        on its chief; the batch in words. `gone`: why nodes are missing, for a refusal.

        Raises:
            FewerWorkersRefused: too few workers, or a batch that does not split.
            LaunchError: the plan refuses the layout.
        """
        run = self.run
        layout = run.layout(job) if job.nodes else None
        check_enough(job, len(layout.slots) if layout else 0, run.first_workers, gone)
        batch, words = batch_for(job, run.first_batch, run.first_workers, len(layout.slots))
        if batch != job.batch_size:
            job = replace(job, batch_size=batch)
            layout = run.layout(job)
        chief = run.slots[0].node.name
        run.job, run.plan, run.slots = job, layout.plan, list(layout.slots)
        run.nodes.keep(job, run.slots)
        labels = {slot.label for slot in run.slots}
        returning = [track for track in run.lost_tracks if track.label in labels]
        leaving = [run.tracks.pop(label) for label in list(run.tracks) if label not in labels]
        run.lost_tracks = [track for track in run.lost_tracks if track not in returning] + leaving
        run.tracks.update((track.label, track) for track in returning)
        run.track_slots()
        if run.guard is not None and run.slots[0].node.name != chief:
            await run.take_lock()
        return words


def _usable(node: NodeSession) -> bool:
    """Online and past its login: a node whose login shell is stuck (a stale pyenv lock) is not taken back
    until it answers, so the run never waits on it at an epoch's end."""
    return node.state is NodeState.ONLINE and not node.waiting_on
