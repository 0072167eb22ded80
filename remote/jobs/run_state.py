"""What every part of a run reads and changes (RunState): its job on the nodes it has now, its workers' slots and
tracks, the generation and restarts, its folder and record, the run lock; and the few steps they all take with it
(say the run's state, lay its workers out, the launch of one worker, take the lock)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable, Mapping

from homegpu.remote.config import PER_GPU, JobSpec
from homegpu.remote.events import JobState, JobStateChanged
from homegpu.remote.jobs.backup_copy import BackupKeeper
from homegpu.remote.jobs.guard import RunGuard
from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError
from homegpu.remote.jobs.launch_plan import script_rel, worker_launch
from homegpu.remote.jobs.lock import LockHolder
from homegpu.remote.jobs.watch import WorkerTrack, WorkerWatch
from homegpu.remote.nodes import Cluster, NodeSession, wait_set
from homegpu.remote.placement import RunPlacement
from homegpu.remote.plan import (
    DevicePlan, JobLayout, WorkerSlot, job_node_specs, last_shares, last_timeline, lay_out, tf_config_json,
    worker_slots,
)
from homegpu.remote.record import ExperimentLog, RunRecord
from homegpu.remote.runtimes import WorkerLaunch

POLL_SECONDS = 1.0


class RunState:
    """One run's shared state. The parts of JobRun each hold it; JobRun shows its public attributes."""

    def __init__(self, cluster: Cluster, job: JobSpec, experiments_root: Path, run_id: str,
                 placement: RunPlacement, pinned: Mapping[str, int] | None = None, instance: str = "") -> None:
        self.cluster, self.job, self.hub = cluster, job, cluster.hub
        self.run_id, self.experiments_root, self.placement = run_id, experiments_root, placement
        self.pinned = pinned or {}  # node -> the one GPU the run uses there (the queue shares cards by gpu_memory)
        # the name its lock and code copy go by: the job's, or its own for one of several runs of a job at once
        self.instance = instance or job.name
        self.slots = worker_slots(cluster.spec, job)
        self.generation, self.restarts, self.state = 1, 0, JobState.PREFLIGHT
        self.tracks: dict[str, WorkerTrack] = {}
        self.lost_tracks: list[WorkerTrack] = []  # the workers of nodes the run went on without (run_members.py)
        self.first_batch, self.first_workers = job.batch_size, 0  # the first generation's, for a smaller one
        self.every_node = [node.name for node in job_node_specs(cluster.spec, job)]  # the job's, in TF_CONFIG order
        self.nodes: JobRuntimes | None = None  # the job's runtimes, once prepare() reached its nodes
        self.plan: DevicePlan | None = None  # every worker's devices, once prepare() saw the nodes' GPUs
        self.experiment: ExperimentLog | None = None
        self.record: RunRecord | None = None
        self.backup: BackupKeeper | None = None  # the chief's backup kept off the chief (TensorFlow jobs)
        self.checkpoints: BackupKeeper | None = None  # what a script's chief wrote in its working dir (CheckpointCopy)
        self.guard: RunGuard | None = None  # the job's run lock, once take_lock() was called
        self.adopted = False  # attached to a run another controller started (adopt())
        self._last_run_shares: tuple[int, ...] | None = None  # the job's last run's, read once: () for none
        self.even_generation: int | None = None  # a generation that starts from the even split (run_restarts.py)
        self.on_regroup: Callable[[str], None] | None = None  # told each line of the run going on with other nodes
        self.watch = WorkerWatch(job.name, self.hub, self.tracks)  # polls and notes the tracks' statuses
        self.stop_requested = asyncio.Event()

    def publish(self, state: JobState, detail: str = "", regroup: str = "") -> None:
        self.state = state
        self.hub.publish(JobStateChanged(self.job.name, self.run_id, state, self.generation, self.restarts, detail,
                                         regroup=regroup))

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or less once stop() was asked."""
        await wait_set(self.stop_requested, seconds)

    def start_record(self) -> None:
        nodes = [slot.node.name for slot in self.slots]
        self.record = RunRecord(self.cluster, self.experiments_root / self.run_id, nodes, self.run_id,
                                self.job.name).start()

    def sessions(self) -> list[NodeSession]:
        return [runtime.node for runtime in self.nodes.runtimes.values()]

    def code_dir(self, node: str) -> str:
        """The job's synced code on `node` (once its nodes are open)."""
        return f"{self.nodes.work_dirs[node]}/code/{self.instance}"

    def layout(self, job: JobSpec | None = None) -> JobLayout:
        """The workers of `job` (by default the run's) from the nodes' latest stats. The plan may be missing
        (every worker sees its node's GPUs) only for a numeric layout on a cluster that streams no stats.

        Raises:
            LaunchError: the plan's one line refusing the layout.
        """
        job = job or self.job
        sessions = [self.cluster.node(node.name) for node in job_node_specs(self.cluster.spec, job)]
        need_plan = job.workers_per_node == PER_GPU or all(s.streams_stats for s in sessions)
        layout = lay_out(self.cluster.spec, job, {s.name: s.latest for s in sessions}, self.cluster.addresses(),
                         last_timeline(self.experiments_root, job.name), need_plan, self.pinned)
        if layout.refusal:
            raise LaunchError(layout.refusal)
        return layout

    def track_slots(self) -> None:
        """A WorkerTrack for each slot (a slot's track kept across generations, told its new place)."""
        for slot in self.slots:
            if slot.label in self.tracks:
                self.tracks[slot.label].slot = slot
                continue
            runtime = self.nodes.runtime(slot)
            seen_as = runtime.worker_paths(self.run_id, slot.label, self.code_dir(slot.node.name), self.job.data_dir,
                                           self.job.python).code_dir
            self.tracks.setdefault(slot.label, WorkerTrack(slot, runtime, code_dir=seen_as))

    def launch_for(self, slot: WorkerSlot) -> WorkerLaunch:
        return worker_launch(self.job, self.run_id, self.generation, self.slots, slot, self.tracks[slot.label].runtime,
                             self.code_dir(slot.node.name), self.plan, script_rel(self.job, self.cluster.spec.source),
                             self.first_shares())

    def first_shares(self) -> tuple[int, ...] | None:
        """The shares of a step the next generation starts with: what this run's chief said last, else what the
        job's last run on the same workers ended with (a worker ignores shares that do not fit its run); none where
        this generation is to start even."""
        if self.generation == self.even_generation:
            return None
        chief = self.tracks.get(self.slots[0].label)
        if chief is not None and chief.last_metric.shares:
            return chief.last_metric.shares
        if self._last_run_shares is None:
            self._last_run_shares = last_shares(self.experiments_root, self.job.name,
                                                [slot.label for slot in self.slots]) or ()
        return self._last_run_shares or None

    def launch_lines(self) -> dict[str, str]:
        """Worker label -> its TF_CONFIG, or for a PyTorch job its node's torchrun line, for a JAX job its
        process's variables and command (run.json)."""
        if self.job.is_tensorflow:
            return {s.label: tf_config_json(self.slots, s.index) for s in self.slots}
        layout = JobLayout(tuple(self.slots), self.plan)
        return {s.label: layout.launch_line(self.job, s) for s in self.slots}

    async def take_lock(self) -> LockHolder | None:
        """Take the job's run lock on the chief's node; the holder when another controller has it.

        Raises:
            LaunchError: the lock could not be read or written (node gone, no python there).
        """
        chief = self.slots[0].node.name
        self.guard = RunGuard(self.cluster.node(chief), self.nodes.work_dirs[chief], self.instance, self.run_id)
        return await self.guard.take()

    @property
    def led_elsewhere(self) -> bool:
        """Attached to a run whose lock another controller holds (adopt(), no lock taken): that one acts on it."""
        return self.adopted and not (self.guard is not None and self.guard.held)

    def chief_track(self) -> WorkerTrack:
        return self.tracks[self.slots[0].label]

    def keepers(self) -> list[BackupKeeper]:
        """The copies kept off the chief (its backup, a script's checkpoint), each put onto every new generation."""
        return [keeper for keeper in (self.backup, self.checkpoints) if keeper is not None]
