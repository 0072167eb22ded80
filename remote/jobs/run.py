"""JobRun: one run of a job across its nodes — launch or attach, watch, restart, stop — conducting the parts that
each do one thing of it over the state they share (run_state.py).

Launch is all-or-nothing: the run is placed on its nodes (run_placing.py: the cluster's placement, homegpu's own or
Slurm, remote/placement/), every node passes preflight before anything starts, and if one start fails the workers
that did start are stopped again (run_launch.py, run_generation.py). While the run lives, each worker's log is
followed (remote/jobs/worker_logs.py) and its state is polled on the node (remote/jobs/watch.py). A worker that fails
or stalls makes the whole run restart with the same TF_CONFIG and the next generation (run_restarts.py: the trainer's
BackupAndRestore resumes the epoch, and a script's checkpoint reaches every worker, run_backups.py), unless it is a
script error (remote/jobs/failure.py) or the workers would resume from different epochs (resume_check.py); a node
that does not come back goes on without it where the job's min_workers allows, and rejoins once back
(run_members.py). The run holds its job's run lock (remote/jobs/guard.py) while it lives; a controller that attached
to another's run follows that one (run_following.py). At the end every log is read to its end and the chief's outputs
come home (run_end.py).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from homegpu.remote.config import JobSpec
from homegpu.remote.events import JobState
from homegpu.remote.jobs.job_runtimes import LaunchError
from homegpu.remote.jobs.launch_plan import new_run_id
from homegpu.remote.jobs.lock import LockHolder
from homegpu.remote.jobs.run_backups import RunBackups
from homegpu.remote.jobs.run_end import RunEnd, RunOutcome
from homegpu.remote.jobs.run_following import Following
from homegpu.remote.jobs.run_generation import Generations
from homegpu.remote.jobs.run_launch import Launch
from homegpu.remote.jobs.run_members import Members
from homegpu.remote.jobs.run_placing import RunPlacing
from homegpu.remote.jobs.run_restarts import Restarts
from homegpu.remote.jobs.run_state import POLL_SECONDS, RunState
from homegpu.remote.jobs.watch import all_succeeded, ended_runtimes
from homegpu.remote.nodes import Cluster
from homegpu.remote.placement import RunPlacement, make_placement
from homegpu.remote.runtimes import STOP_GRACE_SECONDS

LOCK_WAIT_SECONDS = 90.0  # for another controller's launch (preflight, sync) to show its workers


def _shared(name: str) -> Any:
    """One of RunState's attributes, read and set through the JobRun that conducts it."""
    return property(lambda run: getattr(run._run, name), lambda run, value: setattr(run._run, name, value))


class JobRun:
    """A run of `job` on `cluster`. Call launch_or_attach() (or launch() or adopt()), then watch(); stop() from
    anywhere. `placement`: where the run is placed (by default, the cluster's: `[cluster] scheduler`); `pinned`:
    node -> the one GPU the run uses there (the queue sharing a card by gpu_memory), else all of a node's;
    `instance`: the name its lock and code copy go by, where it is one of several runs of the job at once (the
    queue's runs sharing cards), else the job's (one run per job: a second attaches to the first)."""

    cluster = _shared("cluster")
    hub = _shared("hub")
    job = _shared("job")
    run_id = _shared("run_id")
    experiments_root = _shared("experiments_root")
    slots = _shared("slots")
    plan = _shared("plan")
    nodes = _shared("nodes")
    generation = _shared("generation")
    restarts = _shared("restarts")
    state = _shared("state")
    tracks = _shared("tracks")
    experiment = _shared("experiment")
    on_regroup = _shared("on_regroup")

    def __init__(self, cluster: Cluster, job: JobSpec, experiments_root: Path, run_id: str | None = None,
                 placement: RunPlacement | None = None, pinned: Mapping[str, int] | None = None,
                 instance: str = "") -> None:
        placement = placement or make_placement(cluster.spec).for_run(cluster)
        self._run = run = RunState(cluster, job, experiments_root, run_id or new_run_id(job.name), placement, pinned,
                                   instance)
        self._placing, self._backups, self._end = RunPlacing(run), RunBackups(run), RunEnd(run)
        self._generations = Generations(run, self._backups)
        self._members = Members(run, self._generations, self._backups)
        self._restarts = Restarts(run, self._generations, self._members)
        self._following = Following(run, self._generations, self._backups)
        self._launch = Launch(run, self._generations, self._backups)

    def code_dir(self, node: str) -> str:
        """The job's synced code on `node` (after prepare())."""
        return self._run.code_dir(node)

    # -- placed and opened -------------------------------------------------------------------

    async def prepare(self, timeout: float | None = None, waking: Callable[[str], None] | None = None) -> None:
        """Wait for the job's nodes, lay its workers out on their GPUs (the device plan) and make a
        runtime for each node (once). With `waking` (work is to start), the run is placed (on a Slurm cluster its
        nodes asked of Slurm) and the job's asleep nodes are woken first, each step said to `waking` (say_waking: the
        run's preflight lines); without it an asleep node is a node not reached: looking for a run must not wake a
        machine nor submit a Slurm job.

        Raises:
            LaunchError: a node is not reached (or not woken), or the plan refuses the layout (before anything
                starts).
        """
        if self.nodes is None:
            await self._placing.open(timeout, waking)
        self._run.track_slots()

    def say_waking(self, line: str) -> None:
        """A step of getting the run's nodes (waking them, Slurm allocating them), as a preflight line."""
        self._run.publish(JobState.PREFLIGHT, line)

    async def cancel_placement(self) -> None:
        """Let go of what holds the run's nodes where this controller placed it or launched it (a start that
        failed): on Slurm, scancel its Slurm job."""
        await self._run.placement.cancel()

    # -- launch or attach ----------------------------------------------------------------------

    async def launch_or_attach(self) -> bool:
        """Attach to the job's run if one already runs on its nodes, else launch it under the job's run lock; a
        controller that finds the lock held waits for the holder's workers and attaches to them instead.

        Returns True when it attached (nothing new was started). Raises LaunchError.
        """
        if await self.attach_if_running(wake=True):
            return True
        holder = await self.take_lock()
        if holder is not None:
            return await self._attach_once_started(holder)
        try:
            await self.launch()
        except BaseException:
            await self.release_lock()
            raise
        return False

    async def attach_if_running(self, wake: bool = False) -> bool:
        """Attach to the job if that already runs on its nodes; True when it did. Raises LaunchError.
        `wake`: the job is to run: its asleep nodes are woken first (only looking wakes nothing)."""
        await self.prepare(waking=self.say_waking if wake else None)
        runs = await self.nodes.runs()
        if runs:
            self.adopt(*runs[0], at_once=len(runs))
        return bool(runs)

    async def _attach_once_started(self, holder: LockHolder) -> bool:
        """Another controller holds the job's lock: its launch is under way. Attach to it once its
        workers run, rather than start the job a second time. Raises LaunchError when none appear."""
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            if await self.attach_if_running():
                return True
        raise LaunchError(f"{self.job.name} is being started by {holder.describe()}, whose workers did not "
                          f"appear within {LOCK_WAIT_SECONDS:g} s; wait for it, or stop it: homegpu stop {self.job.name}")

    async def launch(self) -> None:
        """Preflight every node, ship the code, start every worker — or leave nothing running.

        Raises:
            LaunchError: naming each node that is not ready and what to do.
        """
        workers = len(self.slots)
        self._run.placement.launching()
        self._launch.refuse_keras3()  # read here, in a second: before anything on a node or in experiments/
        self._run.start_record()
        try:
            self._run.publish(JobState.PREFLIGHT)
            await self.prepare(waking=self.say_waking)
            await self._launch.go(workers)
        except BaseException:
            await self._run.record.close()
            await self.cancel_placement()
            raise

    async def take_lock(self) -> LockHolder | None:
        """Take the job's run lock on the chief's node; the holder when another controller has it.

        Raises:
            LaunchError: the lock could not be read or written (node gone, no python there).
        """
        return await self._run.take_lock()

    async def release_lock(self) -> None:
        if self._run.guard is not None:
            await self._run.guard.release()

    def adopt(self, run_id: str, generation: int, at_once: int = 1) -> None:
        """Take over a run started by another homegpu process: follow it, never start it twice. `at_once`: how
        many runs of the job run now (the queue's runs sharing cards), this the newest."""
        self._following.adopt(run_id, generation, at_once)

    # -- watch ---------------------------------------------------------------------------------

    async def watch(self) -> RunOutcome:
        """Follow the run until it succeeds, fails for good, or stop() is called; then read every
        worker's log to its end and fetch the chief's outputs."""
        try:
            state, detail = await self._follow_to_end()
        except BaseException:
            await self._end.abandon()
            raise
        outcome = await self._end.finish(state, detail)
        await self.release_lock()
        await self._placing.release(state)
        return await self._end.with_report(outcome)

    async def _follow_to_end(self) -> tuple[JobState, str]:
        run = self._run
        while True:
            if run.stop_requested.is_set():
                run.publish(JobState.STOPPING, f"TERM to every worker, KILL after {STOP_GRACE_SECONDS:g} s")
                await self._generations.stop_workers()
                return JobState.STOPPED, "stopped"
            if (ended := await self._one_check()) is not None:
                return ended
            if ended := await self._placing.ended():
                run.publish(JobState.STOPPING, ended)
                await self._generations.stop_workers()
                return JobState.FAILED, ended
            if run.guard is not None:
                await run.guard.heartbeat()
            await run.sleep(POLL_SECONDS)

    async def _one_check(self) -> tuple[JobState, str] | None:
        """One look at the workers, and what follows from it: how the run ended, or None while it goes on."""
        run = self._run
        failure = await run.watch.check(run.run_id, run.generation, run.job.stall_timeout)
        if not (run.led_elsewhere or all_succeeded(run.tracks.values())) and (drift := self._backups.drift()):
            await self._generations.stop_workers()
            return JobState.FAILED, drift
        if failure is None:
            if all_succeeded(run.tracks.values()):
                return JobState.SUCCEEDED, "every worker succeeded"
            for keeper in ([] if run.led_elsewhere else run.keepers()):  # the run's controller keeps the one copy
                keeper.after_epoch()
            problem = await self._members.rejoin_at_epoch_end()
            if problem is not None and (failure := await self._restarts.restart(f"restart failed: {problem}")):
                return JobState.FAILED, failure
        elif await run.nodes.stop_marked(run.run_id, ended_runtimes(run.tracks.values())):
            await self._generations.stop_workers()
            return JobState.STOPPED, "stopped with `homegpu stop`"
        elif run.led_elsewhere:
            return await self._following.follow_its_controller(failure)
        elif (failure := await self._restarts.restart(failure)) is not None:
            return JobState.FAILED, failure
        return None

    async def detach(self) -> None:
        """Leave the run going on its nodes and stop following it here."""
        await self._end.leave()

    def stop(self) -> None:
        """Ask watch() to stop every worker (TERM, a grace period, then KILL) and end the run."""
        self._run.stop_requested.set()
