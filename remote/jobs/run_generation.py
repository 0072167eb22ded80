"""A generation of a run's workers: started all-or-nothing, their logs followed, stopped, removed, and the next one
started from the same backup."""

from __future__ import annotations

import asyncio
import time

from homegpu.remote.events import JobState
from homegpu.remote.jobs.job_runtimes import LaunchError
from homegpu.remote.jobs.preflight import restart_port_problems
from homegpu.remote.jobs.run_backups import RunBackups
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.worker_logs import WorkerLines, finish_tails
from homegpu.remote.nodes import cause
from homegpu.remote.runtimes import WorkerLaunch, WorkerStatus


class Generations:
    """Start, follow, stop and end the run's generations of workers."""

    def __init__(self, run: RunState, backups: RunBackups) -> None:
        self.run, self.backups = run, backups

    async def start(self) -> None:
        """Start every worker of the run's generation, or stop those that started.

        Raises:
            LaunchError: naming each worker that did not start and why.
        """
        run = self.run
        what = {"pytorch": "torchrun on", "jax": "JAX on"}.get(run.job.framework, "TensorFlow on")
        unit = {"pytorch": "node", "jax": "process"}.get(run.job.framework, "worker")
        run.publish(JobState.STARTING, f"starting {what} {len(run.slots)} {unit}(s)")
        launches = [run.launch_for(slot) for slot in run.slots]
        results = await asyncio.gather(*(run.tracks[l.label].runtime.start(l) for l in launches),
                                       return_exceptions=True)
        failed = [(l, r) for l, r in zip(launches, results) if isinstance(r, BaseException)]
        if failed:
            await self.stop_workers()
            raise LaunchError("; ".join(_describe_failure(l, r) for l, r in failed))
        self.follow_logs()
        run.publish(JobState.RUNNING)

    def follow_logs(self, recorded: dict[str, int] | None = None) -> None:
        run = self.run
        lines = WorkerLines(run.job.name, run.run_id, run.hub, run.tracks, run.experiment, self.held_back,
                            nudge=run.watch.nudge)
        lines.follow(run.generation, run.job.batch_size if run.job.uses_trainer else None, recorded)

    def held_back(self, worker: str) -> list[str]:
        """What holds `worker`'s GPUs back now (all its node's where the plan does not say which it uses),
        as the node's session judged its stats line by line."""
        run = self.run
        track = run.tracks[worker]
        devices = next((w for w in run.plan.workers if w.label == worker), None) if run.plan else None
        return run.cluster.node(track.slot.node.name).health.causes(devices.gpus if devices else None)

    def begin(self, generation: int) -> None:
        """The run's generation is `generation` now: every track's status and activity start afresh."""
        self.run.generation = generation
        for track in self.run.tracks.values():
            track.status, track.last_activity, track.progressed = None, time.monotonic(), False
        self.run.watch.nudge()  # the new generation's first check polls

    async def start_next(self) -> str | None:
        """Start the next generation of the stopped run, every worker from the same backup; why it could not."""
        run = self.run
        problems = await restart_port_problems(run.slots, run.nodes.runtime) or await self.backups.restore()
        if problems:
            return "; ".join(problems)
        self.begin(run.generation + 1)
        try:
            await self.start()
        except LaunchError as exc:
            return str(exc)
        return None

    async def end(self) -> None:
        """Stop every worker, read their logs to the end, remove what they left and take the chief's last backup and
        checkpoint (before the chief may change)."""
        await self.stop_workers()
        await finish_tails(self.run.tracks.values(), self.run.run_id)  # the ended generation's whole log, first
        await self._remove_workers()
        for keeper in self.run.keepers():
            await keeper.refresh()

    async def stop_workers(self) -> None:
        tracks = list(self.run.tracks.values())
        stopped = await self.run.nodes.stop(self.run.run_id, [t.slot for t in tracks])
        for track, status in zip(tracks, stopped):
            if isinstance(status, WorkerStatus):
                track.status = status

    async def _remove_workers(self) -> None:
        """Remove what the stopped generation left (containers), so a restart starts clean."""
        await asyncio.gather(*(t.runtime.remove(self.run.run_id, t.label) for t in self.run.tracks.values()),
                             return_exceptions=True)


def _describe_failure(launch: WorkerLaunch, error: BaseException) -> str:
    text = cause(error)
    return text if launch.slot.node.name in text else f"{launch.slot.node.name}: {text}"
