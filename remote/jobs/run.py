"""JobRun: one run of a job across its nodes — launch, watch, restart, stop — and the state it owns.

Launch is all-or-nothing: every node passes preflight (remote/jobs/preflight.py) before anything
starts, and if one start fails the workers that did start are stopped again. While the run lives,
each worker's log is followed (remote/jobs/worker_logs.py) and its state is polled on the node
(remote/jobs/watch.py). A worker that fails or stalls makes the whole run restart with the same
TF_CONFIG and the next generation (the trainer's BackupAndRestore resumes the epoch), unless it is a
script error (remote/jobs/failure.py); a node that does not come back goes on without it where the job's
min_workers allows (remote/jobs/fewer.py). The run holds its job's run lock (remote/jobs/guard.py, which also
launches or attaches to a run) while it lives; at the end every log is read to its end and the
chief's outputs come home.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from homegpu.remote.config import PER_GPU, JobSpec
from homegpu.remote.jobs.backup_copy import BackupCopy, BackupKeeper, backup_dir
from homegpu.remote.jobs.code_filter import CodeFilter
from homegpu.remote.jobs.codesync import SyncError, read_tree, shipping_line, sync_trees
from homegpu.remote.jobs.disk import full_disks
from homegpu.remote.jobs.failure import Verdict, judge, might_be_script_error
from homegpu.remote.jobs.fewer import (
    FewerWorkersRefused, batch_for, check_enough, going_on_line, job_with, job_without, rejoining_line,
)
from homegpu.remote.jobs.guard import RunGuard
from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError, open_runtime
from homegpu.remote.jobs.launch_plan import (
    TRAINER_PACKAGE_DIR, local_code, new_run_id, script_rel, trainer_package, worker_launch,
)
from homegpu.remote.jobs.lock import STALE_AFTER_SECONDS, LockHolder, RunLockError
from homegpu.remote.jobs.lock import holder as lock_holder
from homegpu.remote.jobs.outputs import FetchedOutputs, fetch_outputs, remove_backups
from homegpu.remote.jobs.preflight import restart_port_problems, run_preflight
from homegpu.remote.jobs.script_check import keras3_problem, nccl_on_cpu_problem
from homegpu.remote.jobs.watch import (
    WorkerTrack, WorkerWatch, all_succeeded, ended_runtimes, retry_is_pointless, worker_ends,
)
from homegpu.remote.jobs.worker_logs import WorkerLines, finish_tails, stop_tails
from homegpu.remote.logs import Metric
from homegpu.remote.nodes import (
    NODE_GONE, REJOINED, SHRUNK, Cluster, JobState, JobStateChanged, NodeSession, NodeState, cause, connect_wait,
    wait_set,
)
from homegpu.remote.sleep_wake import WakeFailed, wake_asleep
from homegpu.remote.plan import (
    DevicePlan, JobLayout, WorkerSlot, job_node_specs, last_timeline, lay_out, tf_config_json, worker_slots,
)
from homegpu.remote.record import ExperimentLog, RunEnergy, RunRecord
from homegpu.remote.runtimes import STOP_GRACE_SECONDS, WorkerLaunch, WorkerStatus
from homegpu.remote.slurm import SlurmAllocation, SlurmError, SlurmLogin, running_run

POLL_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
FOLLOW_SECONDS = 2.0  # how often a controller that attached looks for what the run's own controller did
GONE, STALE, HEARD = "gone", "stale", "heard"  # the run's own controller, as its lock says (_its_controller)
SLURM_CHECK_SECONDS = 10.0  # how often a run on Slurm's nodes asks squeue whether Slurm still holds them
SCRIPT_ERROR_WAIT = 10.0  # for the other workers to fail by themselves too (a script error fails them all)


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended. `incomplete_logs`: "WORKER: where the full log is" for each worker whose log
    could not be read to its end (its node was gone); `outputs`: what came home from the chief."""

    state: JobState
    detail: str
    workers: tuple[tuple[str, WorkerStatus | None, Metric], ...]
    incomplete_logs: tuple[str, ...] = ()
    outputs: FetchedOutputs = FetchedOutputs()
    report: tuple[Path | None, str] = (None, "")  # report.html and its summary, or why there is none
    energy: RunEnergy | None = None  # the GPUs' energy and its cost, when any GPU reported its power
    left: tuple[str, ...] = ()  # "WORKER: where its full log is" for each worker of a node the run went on without


class JobRun:
    """A run of `job` on `cluster`. Call launch() or adopt(), then watch(); stop() from anywhere."""

    def __init__(self, cluster: Cluster, job: JobSpec, experiments_root: Path,
                 run_id: str | None = None) -> None:
        self.cluster, self.job = cluster, job
        self.hub = cluster.hub
        self.run_id = run_id or new_run_id(job.name)
        self.experiments_root = experiments_root
        self.slots = worker_slots(cluster.spec, job)
        self.generation = 1
        self.restarts = 0
        self.state = JobState.PREFLIGHT
        self.tracks: dict[str, WorkerTrack] = {}
        self.lost_tracks: list[WorkerTrack] = []  # the workers of nodes the run went on without (_go_on_without)
        self._first_batch, self._first_workers = job.batch_size, 0  # the first generation's, for a smaller one
        self._every_node = [node.name for node in job_node_specs(cluster.spec, job)]  # the job's, in TF_CONFIG order
        self._back_since_epoch: int | None = None  # the chief's epoch when a lost node was first seen back
        self.backup: BackupKeeper | None = None  # the chief's backup kept off the chief (TensorFlow jobs)
        self.on_regroup: Callable[[str], None] | None = None  # told each line of the run going on with other nodes
        self.nodes: JobRuntimes | None = None  # the job's runtimes, once prepare() reached its nodes
        self.plan: DevicePlan | None = None  # every worker's devices, once prepare() saw the nodes' GPUs
        self.allocation: SlurmAllocation | None = None  # the Slurm job holding the run's nodes (scheduler "slurm")
        self._owns_allocation = False  # submitted here, or launched on here: cancelled when the start fails
        self.priority = 0  # a queued run's (homegpu submit --priority): Slurm's nice is its opposite
        self.slurm_after: tuple[str, ...] = ()  # Slurm jobs that must succeed first (homegpu submit --after)
        self.on_slurm_job: Callable[[str], None] | None = None  # told the Slurm job's id once submitted
        self._slurm_checked = 0.0  # when squeue was last asked whether Slurm still holds the run's nodes
        self.experiment: ExperimentLog | None = None
        self.record: RunRecord | None = None
        self.energy: RunEnergy | None = None  # read from the record when it closes
        self._guard: RunGuard | None = None  # the job's run lock, once take_lock() was called
        self._adopted = False  # attached to a run another controller started (adopt())
        self._watch = WorkerWatch(job.name, self.hub, self.tracks)  # polls and notes the tracks' statuses
        self._stop_requested = asyncio.Event()

    # -- setup -------------------------------------------------------------------------------

    def _nodes(self) -> list[NodeSession]:
        return [runtime.node for runtime in self.nodes.runtimes.values()]

    def code_dir(self, node: str) -> str:
        """The job's synced code on `node` (after prepare())."""
        return f"{self.nodes.work_dirs[node]}/code/{self.job.name}"

    async def prepare(self, timeout: float | None = None, waking: Callable[[str], None] | None = None) -> None:
        """Wait for the job's nodes, lay its workers out on their GPUs (the device plan) and make a
        runtime for each node (once). With `waking` (work is to start), the job's asleep nodes are woken
        first, and on a Slurm cluster its nodes are asked of Slurm, each step said to `waking` (say_waking: the run's
        preflight lines); without it an asleep node is a node not reached: looking for a run must not wake a machine
        nor submit a Slurm job.

        Raises:
            LaunchError: a node is not reached (or not woken), or the plan refuses the layout (before anything
                starts).
        """
        if self.nodes is None:
            try:
                await self._open(timeout, waking)
            except BaseException:
                await self.cancel_allocation()
                raise
        self._track_slots()

    async def _open(self, timeout: float | None, waking: Callable[[str], None] | None) -> None:
        if self.cluster.spec.uses_slurm:
            await self._place_on_slurm(waking)
        if waking is not None:
            await self._wake_asleep_nodes(waking)
        nodes = await self._open_nodes(timeout)
        layout = self._layout()  # now connected: the nodes' addresses and GPUs are known
        self.plan, self.slots = layout.plan, layout.slots
        nodes.slots = list(self.slots)
        self.nodes = nodes
        self._first_workers = len(self.slots)

    async def _open_nodes(self, timeout: float | None) -> JobRuntimes:
        """The job's runtimes; on Slurm's nodes, a node homegpu cannot reach is said as Slurm's, before any start."""
        try:
            return await JobRuntimes.open(self.cluster, self.job, timeout)
        except LaunchError as exc:
            if self.allocation is None:
                raise
            raise LaunchError(f"Slurm allocated {', '.join(self.job.nodes)} to {self.job.name}, and homegpu cannot "
                              f"reach them all over SSH: {exc}") from None

    async def _place_on_slurm(self, waking: Callable[[str], None] | None) -> None:
        """On a Slurm cluster the run's nodes are the ones Slurm allocated: a running Slurm job of this job (another
        controller's run, to attach to), else, when work is to start (`waking`), a new one (remote/slurm/allocation.py),
        whose wait is said to `waking` with Slurm's reasons. Only looking, with none running, keeps the job's nodes.

        Raises:
            LaunchError: Slurm refused the job or ended it before it ran, or allocated a node cluster.toml lacks.
        """
        try:
            slurm = await SlurmLogin.reached(self.cluster.slurm_login(), self.cluster.spec)
            running = running_run(await slurm.queue(), self.job.name)
            if running is not None:
                self.allocation = SlurmAllocation(slurm, self.job, running.run_id, running.job_id)
                nodes = running.nodes()
            elif waking is None:
                return
            else:
                candidates = job_node_specs(self.cluster.spec, self.job)
                self.allocation, self._owns_allocation = SlurmAllocation(slurm, self.job, self.run_id), True
                await self.allocation.submit(len(candidates), nodelist=self.job.nodes, priority=self.priority,
                                             after=self.slurm_after)
                if self.on_slurm_job is not None:
                    self.on_slurm_job(self.allocation.job_id)
                waking(f"Slurm job {self.allocation.job_id} submitted on {slurm.name} for {len(candidates)} node(s)")
                nodes = await self.allocation.wait_running(waking, self._stop_requested)
                waking(f"Slurm job {self.allocation.job_id} runs on {', '.join(nodes)}")
        except SlurmError as exc:
            raise LaunchError(f"{self.job.name}: {exc}") from None
        self._narrow_to(nodes)

    def _narrow_to(self, allocated: list[str]) -> None:
        """The run's job on the nodes Slurm allocated, in the job's order (the first is the chief).

        Raises:
            LaunchError: a node Slurm allocated that cluster.toml has no [[nodes]] for.
        """
        known = [node.name for node in self.cluster.spec.nodes]
        unknown = [name for name in allocated if name not in known]
        if unknown:
            raise LaunchError(f"Slurm allocated {', '.join(unknown)} to {self.job.name}, and {self.cluster.spec.source} "
                              "has no [[nodes]] of that name: add each node named as `sinfo -N` names it")
        order = [node.name for node in job_node_specs(self.cluster.spec, self.job)] + known
        self.job = replace(self.job, nodes=tuple(sorted(allocated, key=order.index)))
        self.slots = worker_slots(self.cluster.spec, self.job)
        self._every_node = list(self.job.nodes)

    async def cancel_allocation(self) -> None:
        """scancel the Slurm job holding the run's nodes where this controller submitted it or launched the run on it
        (a start that failed)."""
        if self.allocation is not None and self._owns_allocation:
            await self.allocation.cancel()

    async def _release_allocation(self, state: JobState) -> None:
        """End the Slurm job holding the run's nodes as the run ended: a stopped run's is cancelled, a run's that
        succeeded COMPLETED, another's FAILED. Whichever controller saw the end does it (the one that started the run
        may be gone: serve resumed it, the TUI attached); ending one that ended already does nothing."""
        if self.allocation is None:
            return
        if state is JobState.STOPPED:
            await self.allocation.cancel()
        else:
            await self.allocation.release(succeeded=state is JobState.SUCCEEDED)

    def _track_slots(self) -> None:
        """A WorkerTrack for each slot (a slot's track kept across generations, told its new place)."""
        for slot in self.slots:
            if slot.label in self.tracks:
                self.tracks[slot.label].slot = slot
                continue
            runtime = self.nodes.runtime(slot)
            seen_as = runtime.worker_paths(self.run_id, slot.label, self.code_dir(slot.node.name), self.job.data_dir,
                                           self.job.python).code_dir
            self.tracks.setdefault(slot.label, WorkerTrack(slot, runtime, code_dir=seen_as))

    def say_waking(self, line: str) -> None:
        """A step of getting the run's nodes (waking them, Slurm allocating them), as a preflight line."""
        self._publish(JobState.PREFLIGHT, line)

    async def _wake_asleep_nodes(self, waking: Callable[[str], None]) -> None:
        """Wake the job's nodes that homegpu put to sleep, saying so (nodes/asleep.py, power/waking.py).

        Raises:
            LaunchError: a node did not wake, naming it and the likely causes.
        """
        names = [node.name for node in job_node_specs(self.cluster.spec, self.job)]
        await self.cluster.wait_settled(connect_wait(self.cluster.spec, 2), names)  # an asleep node is known by then
        try:
            await wake_asleep(self.cluster, names, waking)
        except WakeFailed as exc:
            raise LaunchError(str(exc)) from None

    def _launch_lines(self) -> dict[str, str]:
        """Worker label -> its TF_CONFIG, or for a PyTorch job its node's torchrun line (run.json)."""
        if not self.job.is_pytorch:
            return {s.label: tf_config_json(self.slots, s.index) for s in self.slots}
        layout = JobLayout(tuple(self.slots), self.plan)
        return {s.label: layout.launch_line(self.job, s) for s in self.slots}

    def _layout(self, job: JobSpec | None = None) -> JobLayout:
        """The workers of `job` (by default the run's) from the nodes' latest stats. The plan may be missing
        (every worker sees its node's GPUs) only for a numeric layout on a cluster that streams no stats.

        Raises:
            LaunchError: the plan's one line refusing the layout.
        """
        job = job or self.job
        sessions = [self.cluster.node(node.name) for node in job_node_specs(self.cluster.spec, job)]
        need_plan = job.workers_per_node == PER_GPU or all(s.streams_stats for s in sessions)
        layout = lay_out(self.cluster.spec, job, {s.name: s.latest for s in sessions}, self.cluster.addresses(),
                         last_timeline(self.experiments_root, job.name), need_plan)
        if layout.refusal:
            raise LaunchError(layout.refusal)
        return layout

    def launch_for(self, slot: WorkerSlot) -> WorkerLaunch:
        return worker_launch(self.job, self.run_id, self.generation, self.slots, slot, self.tracks[slot.label].runtime,
                             self.code_dir(slot.node.name), self.plan, script_rel(self.job, self.cluster.spec.source))

    # -- launch --------------------------------------------------------------------------------

    async def launch(self) -> None:
        """Preflight every node, ship the code, start every worker — or leave nothing running.

        Raises:
            LaunchError: naming each node that is not ready and what to do.
        """
        workers = len(self.slots)
        self._owns_allocation = self.allocation is not None  # one left by a controller gone: this run's now
        self._refuse_keras3()  # read here, in a second: before anything on a node or in experiments/
        self._start_record()
        try:
            self._publish(JobState.PREFLIGHT)
            await self.prepare(waking=self.say_waking)
            if len(self.slots) != workers:  # "per-gpu" knows its workers only now
                self._refuse_keras3()
            self._refuse(nccl_on_cpu_problem(self.job, self.cluster.spec.source, self.plan))
            cache_problem = self.record.describe_setup(self.job, self._launch_lines())
            if cache_problem:
                self._publish(JobState.PREFLIGHT, cache_problem)
            await self._preflight()
            await self._sync_code()
            self.experiment = ExperimentLog(self.experiments_root, self.run_id)
            self._keep_backup_copies()
            try:
                await self._start_generation()
            except LaunchError:
                self._publish(JobState.FAILED, "start failed")
                raise
        except BaseException:
            await self.record.close()
            await self.cancel_allocation()
            raise

    def _refuse_keras3(self) -> None:
        """Raises LaunchError when the job's script would train with Keras 3 under the strategy."""
        self._refuse(keras3_problem(self.job, self.cluster.spec.source, len(self.slots)))

    def _refuse(self, problem: str) -> None:
        """Raises LaunchError with `problem`, what reading the script found it cannot train with ("": none)."""
        if problem:
            self._publish(JobState.FAILED, "preflight failed")
            raise LaunchError(problem)

    def _start_record(self) -> None:
        nodes = [slot.node.name for slot in self.slots]
        self.record = RunRecord(self.cluster, self.experiments_root / self.run_id, nodes, self.run_id,
                                self.job.name).start()

    async def _preflight(self) -> None:
        problems = await run_preflight(self.cluster, self.job, self.run_id, self.slots, self.nodes.runtime,
                                       self.launch_for, local_code(self.job, self.cluster.spec.source), self.plan)
        if problems:
            self._publish(JobState.FAILED, "preflight failed")
            raise LaunchError("; ".join(problems))

    async def take_lock(self) -> LockHolder | None:
        """Take the job's run lock on the chief's node; the holder when another controller has it.

        Raises:
            LaunchError: the lock could not be read or written (node gone, no python there).
        """
        chief = self.slots[0].node.name
        self._guard = RunGuard(self.cluster.node(chief), self.nodes.work_dirs[chief], self.job.name, self.run_id)
        return await self._guard.take()

    async def release_lock(self) -> None:
        if self._guard is not None:
            await self._guard.release()

    async def _sync_code(self) -> None:
        """Ship the job's code, less homegpu's own output and what its ignore files say (CodeFilter),
        saying what it ships; then homegpu's trainer package beside it (the built-in trainer, and the
        start of a user's script: nodes need no homegpu install) under the code's `_homegpu/`."""
        nodes = self._nodes()
        try:
            trees = [(await read_tree(trainer_package()), f"/{TRAINER_PACKAGE_DIR}/homegpu/trainer"),
                     (await read_tree(trainer_package() / "report"), f"/{TRAINER_PACKAGE_DIR}/homegpu/report")]
            if not self.job.uses_trainer:
                code = local_code(self.job, self.cluster.spec.source)
                trees.insert(0, (await read_tree(code, CodeFilter(code, self.experiments_root)), ""))
        except SyncError as exc:
            raise LaunchError(f"code sync failed: {exc}") from None
        self._publish(JobState.PREFLIGHT, f"syncing code to {len(nodes)} node(s)" if self.job.uses_trainer
                      else shipping_line(trees[0][0], [node.name for node in nodes]))
        for tree, under in trees:  # one after the other: the job's code sync leaves `_homegpu/` alone
            problems = await sync_trees(tree, [(node, self.code_dir(node.name) + under) for node in nodes])
            if problems:
                raise LaunchError("code sync failed: " + "; ".join(problems))

    async def _start_generation(self) -> None:
        what = "torchrun on" if self.job.is_pytorch else "TensorFlow on"
        self._publish(JobState.STARTING, f"starting {what} {len(self.slots)} {'node' if self.job.is_pytorch else 'worker'}(s)")
        launches = [self.launch_for(slot) for slot in self.slots]
        results = await asyncio.gather(*(self.tracks[l.label].runtime.start(l) for l in launches),
                                       return_exceptions=True)
        failed = [(l, r) for l, r in zip(launches, results) if isinstance(r, BaseException)]
        if failed:
            await self._stop_workers()
            raise LaunchError("; ".join(_describe_failure(l, r) for l, r in failed))
        self._follow_logs()
        self._publish(JobState.RUNNING)

    def _follow_logs(self, recorded: dict[str, int] | None = None) -> None:
        lines = WorkerLines(self.job.name, self.run_id, self.hub, self.tracks, self.experiment, self._held_back)
        lines.follow(self.generation, self.job.batch_size if self.job.uses_trainer else None, recorded)

    def _held_back(self, worker: str) -> list[str]:
        """What holds `worker`'s GPUs back now (all its node's where the plan does not say which it uses),
        as the node's session judged its stats line by line."""
        track = self.tracks[worker]
        devices = next((w for w in self.plan.workers if w.label == worker), None) if self.plan else None
        return self.cluster.node(track.slot.node.name).health.causes(devices.gpus if devices else None)

    # -- reattach ------------------------------------------------------------------------------

    def adopt(self, run_id: str, generation: int) -> None:
        """Take over a run started by another homegpu process: follow it, never start it twice."""
        self.run_id, self.generation, self._adopted = run_id, generation, True
        self.experiment = ExperimentLog(self.experiments_root, run_id)
        self._keep_backup_copies()
        self._start_record()
        self._follow_logs({label: self.experiment.recorded_lines(label, generation) for label in self.tracks})
        self._publish(JobState.RUNNING, "attached to a running job")

    # -- watch ---------------------------------------------------------------------------------

    async def watch(self) -> RunOutcome:
        """Follow the run until it succeeds, fails for good, or stop() is called; then read every
        worker's log to its end and fetch the chief's outputs."""
        try:
            state, detail = await self._follow_to_end()
        except BaseException:
            if self.backup is not None:
                await self.backup.stop()
            await stop_tails(self.tracks.values())
            self._close_experiment()
            await self._close_record(report=False)
            raise
        incomplete = await finish_tails(self.tracks.values(), self.run_id)
        outputs = await self._fetch_outputs("" if state is JobState.SUCCEEDED else f"the run {state.value}: {detail}")
        if self.backup is not None:
            await self.backup.stop()
            if state is JobState.SUCCEEDED:
                self.backup.copy.discard()
        if state is JobState.SUCCEEDED and self.job.uses_trainer and not outputs.error:
            await remove_backups([(t.runtime.node, t.runtime.out_dir(self.run_id, t.label))
                                  for t in self.tracks.values()])
        self._close_experiment()
        outcome = self._finish(state, detail, incomplete, outputs)
        await self.release_lock()
        await self._release_allocation(state)
        report = await self._close_record()
        return replace(outcome, report=report, energy=self.energy)

    async def _follow_to_end(self) -> tuple[JobState, str]:
        while True:
            if self._stop_requested.is_set():
                self._publish(JobState.STOPPING, f"TERM to every worker, KILL after {STOP_GRACE_SECONDS:g} s")
                await self._stop_workers()
                return JobState.STOPPED, "stopped"
            failure = await self._watch.check(self.run_id, self.generation, self.job.stall_timeout)
            if failure is None:
                if all_succeeded(self.tracks.values()):
                    return JobState.SUCCEEDED, "every worker succeeded"
                if self.backup is not None and not self._led_elsewhere:  # the run's controller keeps the one copy
                    self.backup.after_epoch()
                if (failure := await self._rejoin_at_epoch_end()) is not None:
                    return JobState.FAILED, failure
            elif await self.nodes.stop_marked(self.run_id, ended_runtimes(self.tracks.values())):
                await self._stop_workers()
                return JobState.STOPPED, "stopped with `homegpu stop`"
            elif self._led_elsewhere:
                if (ended := await self._follow_its_controller(failure)) is not None:
                    return ended
            elif (failure := await self._restart(failure)) is not None:
                return JobState.FAILED, failure
            if ended := await self._allocation_ended():
                self._publish(JobState.STOPPING, ended)
                await self._stop_workers()
                return JobState.FAILED, ended
            if self._guard is not None:
                await self._guard.heartbeat()
            await self._sleep(POLL_SECONDS)

    @property
    def _led_elsewhere(self) -> bool:
        """Attached to a run whose lock another controller holds (adopt(), no lock taken): that one acts on it."""
        return self._adopted and not (self._guard is not None and self._guard.held)

    async def _follow_its_controller(self, failure: str) -> tuple[JobState, str] | None:
        """A run this controller attached to failed: the controller that started it (the run lock's holder) restarts
        or regroups it, not this one too (two would start every worker twice). Follow what it does: the run's next
        generation once it runs, or its end once it releases the lock. None: go on watching (a next generation is
        followed, or the holder's lock went stale and this controller took the run over)."""
        self._publish(JobState.RESTARTING, f"{failure}; the controller that started the run acts on it: following")
        while not self._stop_requested.is_set():
            controller = await self._its_controller()
            if controller == GONE:
                state = await self.nodes.ended_state(self.run_id)
                return state, ("every worker succeeded" if state is JobState.SUCCEEDED else
                               f"ended by the controller that started it, after: {failure}")
            found = await self.nodes.find()
            if found is not None and found[0] == self.run_id and found[1] > self.generation:
                await self._follow_generation(found[1])
                return None
            if controller == STALE and await self._take_over():
                return None
            await self._sleep(FOLLOW_SECONDS)
        return None  # watch() stops the workers

    async def _its_controller(self) -> str:
        """The run's lock as the chief's node has it: GONE (released, or another run's), STALE (no heartbeat for
        STALE_AFTER_SECONDS), else HEARD (or not readable: the chief's node away; its next generation tells)."""
        chief = self.slots[0].node.name
        try:
            holder = await lock_holder(self.cluster.node(chief), self.nodes.work_dirs[chief], self.job.name)
        except (RunLockError, *NODE_GONE):
            return HEARD
        if holder is None or holder.run_id != self.run_id:
            return GONE
        return STALE if holder.age is not None and holder.age >= STALE_AFTER_SECONDS else HEARD

    async def _take_over(self) -> bool:
        """Take the run's lock from a controller gone quiet; whether this controller now leads the run."""
        with contextlib.suppress(LaunchError):
            if await self.take_lock() is None:
                self._publish(JobState.RESTARTING, "the controller that started the run went quiet: taking it over")
                return True
        return False

    async def _follow_generation(self, generation: int) -> None:
        """Follow the generation the run's controller started, as it would itself (its logs, its workers)."""
        await finish_tails(self.tracks.values(), self.run_id)
        self.restarts += 1
        self._begin_generation(generation)
        self._follow_logs()
        self._publish(JobState.RUNNING, f"following generation {generation}, started by the run's controller")

    async def _allocation_ended(self) -> str:
        """Why Slurm ended the job holding the run's nodes (asked every SLURM_CHECK_SECONDS); "" while it holds them."""
        if self.allocation is None or time.monotonic() - self._slurm_checked < SLURM_CHECK_SECONDS:
            return ""
        self._slurm_checked = time.monotonic()
        return await self.allocation.ended()

    def _close_experiment(self) -> None:
        if self.experiment:
            self.experiment.close()

    async def _close_record(self, report: bool = True) -> tuple[Path | None, str]:
        if self.record is None:
            return None, "no record"
        record, self.record = self.record, None
        closed = await record.close(report)
        self.energy = record.energy
        return closed

    async def detach(self) -> None:
        """Leave the run going on its nodes and stop following it here."""
        await stop_tails(self.tracks.values())
        self._close_experiment()
        await self._close_record(report=False)

    def stop(self) -> None:
        """Ask watch() to stop every worker (TERM, a grace period, then KILL) and end the run."""
        self._stop_requested.set()

    async def _sleep(self, seconds: float) -> None:
        await wait_set(self._stop_requested, seconds)

    async def _judge_failure(self) -> Verdict | None:
        """A script error (every worker failed by itself before any progress, with the same error) is
        not a fault: restarting cannot fix it. The other workers get SCRIPT_ERROR_WAIT seconds to end
        by themselves first, since stopping them would hide their own error. None: a fault."""
        if not any(might_be_script_error(end) for end in worker_ends(self.tracks.values())):
            return None
        deadline = time.monotonic() + SCRIPT_ERROR_WAIT
        while time.monotonic() < deadline and not all(t.ended for t in self.tracks.values()):
            await self._sleep(POLL_SECONDS)
            await self._watch.poll(self.run_id, self.generation)
        await finish_tails(self.tracks.values(), self.run_id)  # every worker's own last lines, to compare errors
        return judge(worker_ends(self.tracks.values()))

    async def _restart(self, failure: str) -> str | None:
        """Restart every worker with the next generation, with backoff, while restarts are left.

        A node that is away (rebooting, cut off) is waited for first, up to the job's
        reconnect_timeout, without using up a restart; a restart whose start fails still uses one.
        Returns None once the workers run again, else why the run failed for good.
        """
        if full := await full_disks(self.tracks.values(), self.run_id):
            await self._stop_workers()
            return "; ".join(full)  # a restart would fill it again
        verdict = await self._judge_failure()
        if verdict is not None and verdict.script_error:
            await self._stop_workers()
            return verdict.summary
        while True:
            if self.job.restart != "on-failure" or self.restarts >= self.job.max_restarts \
                    or retry_is_pointless(self.job, self.tracks.values()):
                await self._stop_workers()
                return failure
            self.restarts += 1
            self._publish(JobState.RESTARTING, failure)
            await self._end_generation()
            await self._sleep(min(2.0 ** (self.restarts - 1), MAX_BACKOFF_SECONDS))
            if gone := await self._wait_for_nodes():
                try:
                    await self._go_on_without(gone)
                except FewerWorkersRefused as exc:
                    return f"restart failed: {exc}"
            elif (back := self._returned()) and (problem := await self._take_back(back)):
                self._publish(JobState.RESTARTING, problem)
            if self._stop_requested.is_set():
                return None  # watch() stops what is left
            if (problem := await self._start_next_generation()) is None:
                return None
            failure = f"restart failed: {problem}"

    async def _start_next_generation(self) -> str | None:
        """Start the next generation of the stopped run, every worker from the same backup; why it could not."""
        problems = await restart_port_problems(self.slots, self.nodes.runtime) or await self._restore_backup()
        if problems:
            return "; ".join(problems)
        self._begin_generation(self.generation + 1)
        try:
            await self._start_generation()
        except LaunchError as exc:
            return str(exc)
        return None

    def _begin_generation(self, generation: int) -> None:
        """The run's generation is `generation` now: every track's status and activity start afresh."""
        self.generation = generation
        for track in self.tracks.values():
            track.status, track.last_activity, track.progressed = None, time.monotonic(), False

    async def _wait_for_nodes(self) -> str:
        """Before a restart, wait for the job's nodes that are away, saying so; why they did not come back."""
        if away := self.nodes.away():
            self._publish(JobState.RESTARTING, f"waiting up to {self.job.reconnect_timeout:g} s for "
                          f"{', '.join(node.name for node in away)} to come back ({away[0].state.value})")
        return await self.nodes.wait_back(self.job.reconnect_timeout, self._stop_requested)

    async def _go_on_without(self, gone: str) -> None:
        """Go on with the nodes left where the job's min_workers allows (jobs/fewer.py): the run's job, layout and
        tracks become theirs, the first of them the chief (its run lock moves there), and a line says so.

        Raises:
            FewerWorkersRefused: why the run cannot go on (too few left, a batch that does not split, the plan).
        """
        lost = [(node.name, node.state.value) for node in self.nodes.away()]
        job = job_without(self.job, self._every_node, [name for name, _ in lost])
        try:
            words = await self._regroup(job, gone)
        except LaunchError as exc:
            raise FewerWorkersRefused(f"{gone}; the nodes left cannot take the run: {exc}") from None
        self.restarts -= 1  # a machine that left is no fault of the run's: it spends no restart
        self._say_regroup(going_on_line(lost, self.job.reconnect_timeout, job.nodes, self._resume_epoch(), words),
                          SHRUNK)

    def _returned(self) -> list[str]:
        """The nodes the run went on without that are online again, in the job's order. Not for a PyTorch job: its
        script's snapshot is its own, kept on each node, and a node back would resume from its stale one."""
        if self.job.is_pytorch:
            return []
        lost = {track.slot.node.name for track in self.lost_tracks}
        return [name for name in self._every_node
                if name in lost and self.cluster.node(name).state is NodeState.ONLINE]

    async def _take_back(self, back: list[str]) -> str | None:
        """Lay the run out again with the nodes in `back` (their runtimes opened afresh, their tracks back), saying
        so; why they cannot rejoin (the run goes on without them then)."""
        try:
            opened = {name: await open_runtime(self.cluster, self.cluster.node(name), connect_wait(self.cluster.spec, 1))
                      for name in back}
            self.nodes.add(opened)
            job = job_with(self.job, self._every_node, back)
            words = await self._regroup(job, "")
        except (LaunchError, FewerWorkersRefused) as exc:
            return f"{', '.join(back)} cannot rejoin: {exc}"
        await self.nodes.stop(self.run_id, [slot for slot in self.slots if slot.node.name in back])  # a cut-off
        # node's worker may still run
        self._say_regroup(rejoining_line(back, job.nodes, self._resume_epoch(), words), REJOINED)
        return None

    async def _rejoin_at_epoch_end(self) -> str | None:
        """With `rejoin` (the default), restart everyone with the lost nodes that are back once the chief finishes
        the epoch it was in when they came back; why the run failed, when the restart could not start again."""
        back = self._returned() if self.job.rejoin else []
        epoch = self.tracks[self.slots[0].label].last_metric.epoch or 0
        if not back:
            self._back_since_epoch = None
            return None
        if self._back_since_epoch is None:
            self._back_since_epoch = epoch
        if epoch <= self._back_since_epoch:
            return None
        self._back_since_epoch = None
        await self._end_generation()
        if problem := await self._take_back(back):
            self._publish(JobState.RESTARTING, problem)
        problem = await self._start_next_generation()
        return None if problem is None else await self._restart(f"restart failed: {problem}")

    def _say_regroup(self, line: str, regroup: str) -> None:
        self._publish(JobState.RESTARTING, line, regroup)
        if self.on_regroup is not None:
            self.on_regroup(line)

    async def _regroup(self, job: JobSpec, gone: str) -> str:
        """Make `job` (the run's on other nodes) the run's: its layout, batch (on_fewer_workers), tracks and run lock
        on its chief; the batch in words. `gone`: why nodes are missing, for a refusal.

        Raises:
            FewerWorkersRefused: too few workers, or a batch that does not split.
            LaunchError: the plan refuses the layout.
        """
        layout = self._layout(job) if job.nodes else None
        check_enough(job, len(layout.slots) if layout else 0, self._first_workers, gone)
        batch, words = batch_for(job, self._first_batch, self._first_workers, len(layout.slots))
        if batch != job.batch_size:
            job = replace(job, batch_size=batch)
            layout = self._layout(job)
        chief = self.slots[0].node.name
        self.job, self.plan, self.slots = job, layout.plan, list(layout.slots)
        self.nodes.keep(job, self.slots)
        labels = {slot.label for slot in self.slots}
        returning = [track for track in self.lost_tracks if track.label in labels]
        leaving = [self.tracks.pop(label) for label in list(self.tracks) if label not in labels]
        self.lost_tracks = [track for track in self.lost_tracks if track not in returning] + leaving
        self.tracks.update((track.label, track) for track in returning)
        self._track_slots()
        if self._guard is not None and self.slots[0].node.name != chief:
            await self.take_lock()
        return words

    # -- the chief's backup, off the chief (jobs/backup_copy.py) ---------------------------------

    def _keep_backup_copies(self) -> None:
        if not self.job.is_pytorch and self.backup is None:
            copy = BackupCopy(self.experiment.folder.path / "chief-backup")
            self.backup = BackupKeeper(copy, self._backup_sources, lambda line: self._publish(self.state, line))

    def _backup_of(self, track: WorkerTrack) -> tuple[NodeSession, str]:
        """A worker's node and its backup dir there."""
        return track.runtime.node, backup_dir(track.runtime.out_dir(self.run_id, track.label))

    def _backup_sources(self) -> list[tuple[NodeSession, str, int]]:
        """Where the newest backup is, best first (backup_copy.BackupSources): the chief's, and for the built-in
        trainer, whose every worker keeps the same one, the other workers' (node online, an epoch finished)."""
        tracks = [self.tracks[slot.label] for slot in self.slots]
        return [(*self._backup_of(t), t.last_metric.epoch) for t in (tracks if self.job.uses_trainer else tracks[:1])
                if t.last_metric.epoch and t.runtime.node.state is NodeState.ONLINE]

    async def _restore_backup(self) -> list[str]:
        """Put the copy of the chief's backup onto every worker, so that all resume from the same epoch."""
        if self.backup is None:
            return []
        return await self.backup.put([self._backup_of(t) for t in self.tracks.values()])

    def _resume_epoch(self) -> int | None:
        """The epochs the next generation resumes after: the copy's, else the built-in trainer's workers' (each has
        its own backup); None for a script without a backup (it starts over, unless it resumes by itself)."""
        if self.backup is not None and self.backup.epoch is not None:
            return self.backup.epoch
        if not self.job.uses_trainer:
            return None
        return max((t.last_metric.epoch or 0 for t in self.tracks.values()), default=0)

    async def _end_generation(self) -> None:
        """Stop every worker, read their logs to the end, remove what they left and take the chief's last backup
        (before the chief may change)."""
        await self._stop_workers()
        await finish_tails(self.tracks.values(), self.run_id)  # the ended generation's whole log, first
        await self._remove_workers()
        if self.backup is not None:
            await self.backup.refresh()

    async def _stop_workers(self) -> None:
        tracks = list(self.tracks.values())
        stopped = await self.nodes.stop(self.run_id, [t.slot for t in tracks])
        for track, status in zip(tracks, stopped):
            if isinstance(status, WorkerStatus):
                track.status = status

    async def _remove_workers(self) -> None:
        """Remove what the stopped generation left (containers), so a restart starts clean."""
        await asyncio.gather(*(t.runtime.remove(self.run_id, t.label) for t in self.tracks.values()),
                             return_exceptions=True)

    # -- end -----------------------------------------------------------------------------------

    async def _fetch_outputs(self, unfinished: str) -> FetchedOutputs:
        """What the chief wrote in its output dir, into experiments/RUN-ID/output/ (not its backups);
        `unfinished`: why the run did not succeed, so that what came home is marked partial."""
        if not self.experiment:
            return FetchedOutputs()
        chief = self.tracks[self.slots[0].label]
        self._publish(self.state, "fetching the chief's outputs")
        return await fetch_outputs(chief.runtime.node, chief.runtime.out_dir(self.run_id, chief.label),
                                   self.experiment.folder.output, unfinished=unfinished)

    def _finish(self, state: JobState, detail: str, incomplete: tuple[str, ...] = (),
                outputs: FetchedOutputs = FetchedOutputs()) -> RunOutcome:
        self._publish(state, detail)
        tracks = [*self.tracks.values(), *self.lost_tracks]
        left = tuple(f"{t.label}: its full log is on {t.slot.node.name} in {t.runtime.run_dir(self.run_id)}"
                     for t in self.lost_tracks)
        return RunOutcome(state, detail, tuple((t.label, t.status, t.last_metric) for t in tracks), incomplete, outputs,
                          left=left)

    def _publish(self, state: JobState, detail: str = "", regroup: str = "") -> None:
        self.state = state
        self.hub.publish(JobStateChanged(self.job.name, self.run_id, state, self.generation, self.restarts, detail,
                                         regroup=regroup))


def _describe_failure(launch: WorkerLaunch, error: BaseException) -> str:
    text = cause(error)
    return text if launch.slot.node.name in text else f"{launch.slot.node.name}: {text}"
