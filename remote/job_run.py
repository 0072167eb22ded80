"""JobRun: one run of a job across its nodes — preflight, launch, watch, restart, stop.

Launch is all-or-nothing: every node passes preflight before anything starts, and if one start
fails the workers that did start are stopped again. While the run lives, each worker's log is
followed (LogLine events, experiments/RUN-ID/logs/), its metric lines become Metric events, and its
state is polled on the node. A worker that fails or stalls makes the whole run restart with the
same TF_CONFIG and the next generation (the trainer's BackupAndRestore resumes the epoch).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from homegpu.remote.cluster import Cluster
from homegpu.remote.codesync import SyncError, sync_tree
from homegpu.remote.config import EMBEDDED_DEFAULT
from homegpu.remote.device_plan import DevicePlan, DevicePlanError, docker_device_ids
from homegpu.remote.events import JobState, JobStateChanged, Metric, PreflightResult, Straggler, WorkerExited
from homegpu.remote.experiment import ExperimentLog, find_stragglers
from homegpu.remote.failure import PROGRESS_EVENTS, Verdict, WorkerEnd, judge, might_be_script_error
from homegpu.remote.gpu_owners import foreign_memory_warnings
from homegpu.remote.job_config import PER_GPU, JobSpec
from homegpu.remote.job_plan import (
    TRAINER_PACKAGE_DIR, classify_exit, new_run_id, worker_argv, worker_cwd, worker_env, worker_markers,
)
from homegpu.remote.last_run import last_timeline
from homegpu.remote.logtail import LogLine, LogTail
from homegpu.remote.node import NODE_GONE, NodeSession
from homegpu.remote.outputs import FetchedOutputs, fetch_outputs, remove_backups
from homegpu.remote.preflight import node_preflight, port_problems
from homegpu.remote.reach import Endpoint, reach_problems
from homegpu.remote.run_lock import LockHolder, RunLockError, acquire, refresh, release
from homegpu.remote.run_record import RunRecord
from homegpu.remote.runs import JobNodes, LaunchError
from homegpu.remote.runtime import STOP_GRACE_SECONDS, Runtime, WorkerLaunch, WorkerStatus
from homegpu.remote.runtime_errors import RuntimeError_
from homegpu.remote.stats import describe_gpus
from homegpu.remote.tfconfig import (
    WorkerSlot, job_device_plan, job_nodes, plan_counts, tf_config_json, worker_slots,
)

POLL_SECONDS = 1.0
MAX_BACKOFF_SECONDS = 30.0
SCRIPT_ERROR_WAIT = 10.0  # for the other workers to fail by themselves too (a script error fails them all)
LOCK_WAIT_SECONDS = 90.0  # for another controller's launch (preflight, sync) to show its workers
HEARTBEAT_SECONDS = 20.0  # the run lock's, so another controller sees this one is alive
LOG_DRAIN_SECONDS = 60.0  # to read an ended worker's log to its end (a flood of megabytes over SSH)


@dataclass
class WorkerTrack:
    """What the controller knows of one worker right now."""

    slot: WorkerSlot
    runtime: Runtime
    last_activity: float = field(default_factory=time.monotonic)
    status: WorkerStatus | None = None
    tail: LogTail | None = None
    last_metric: dict = field(default_factory=dict)
    progressed: bool = False  # this generation trained (a step, epoch or end metric line came)

    @property
    def label(self) -> str:
        return self.slot.label


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended. `incomplete_logs`: "WORKER: where the full log is" for each worker whose log
    could not be read to its end (its node was gone); `outputs`: what came home from the chief."""

    state: JobState
    detail: str
    workers: tuple[tuple[str, WorkerStatus | None, dict], ...]
    incomplete_logs: tuple[str, ...] = ()
    outputs: FetchedOutputs = FetchedOutputs()
    report: tuple[Path | None, str] = (None, "")  # report.html and its summary, or why there is none


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
        self.nodes: JobNodes | None = None  # the job's runtimes, once prepare() reached its nodes
        self.plan: DevicePlan | None = None  # every worker's devices, once prepare() saw the nodes' GPUs
        self.experiment: ExperimentLog | None = None
        self.record: RunRecord | None = None
        self._locked = False  # this run holds the job's run lock (remote/run_lock.py)
        self._last_heartbeat = 0.0
        self._stop_requested = asyncio.Event()

    # -- setup -------------------------------------------------------------------------------

    def _nodes(self) -> list[NodeSession]:
        return [runtime.node for runtime in self.nodes.runtimes.values()]

    def code_dir(self, node: str) -> str:
        """The job's synced code on `node` (after prepare())."""
        return f"{self.nodes.work_dirs[node]}/code/{self.job.name}"

    async def prepare(self, timeout: float | None = None) -> None:
        """Wait for the job's nodes, lay its workers out on their GPUs (the device plan) and make a
        runtime for each node (once).

        Raises:
            LaunchError: a node is not reached, or the plan refuses the layout (before anything starts).
        """
        if self.nodes is None:
            nodes = await JobNodes.open(self.cluster, self.job, timeout)
            self.plan = self._device_plan()
            counts = plan_counts(self.plan) if self.plan else None
            self.slots = worker_slots(self.cluster.spec, self.job, self.cluster.addresses(), counts)  # now connected
            nodes.slots = list(self.slots)
            self.nodes = nodes
        for slot in self.slots:
            self.tracks.setdefault(slot.label, WorkerTrack(slot, self.nodes.runtime(slot)))

    def _device_plan(self) -> DevicePlan | None:
        """The plan from the nodes' latest stats; None (every worker sees its node's GPUs) only for a
        numeric layout on a cluster that streams no stats. Raises LaunchError: the plan's one line."""
        sessions = [self.cluster.node(node.name) for node in job_nodes(self.cluster.spec, self.job)]
        if self.job.workers_per_node != PER_GPU and not all(s.streams_stats for s in sessions):
            return None
        try:
            return job_device_plan(self.cluster.spec, self.job, {s.name: s.latest for s in sessions},
                                   last_timeline(self.experiments_root, self.job.name))
        except DevicePlanError as exc:
            raise LaunchError(f"job {self.job.name}: {exc}") from None

    def launch_for(self, slot: WorkerSlot) -> WorkerLaunch:
        runtime = self.tracks[slot.label].runtime
        code_dir = self.code_dir(slot.node.name)
        paths = runtime.worker_paths(self.run_id, slot.label, code_dir, self.job.data_dir, self.job.python)
        devices = self.plan.workers[slot.index] if self.plan else None
        env = worker_env(self.job, paths)
        if devices is not None:  # the job's own env may still override what the plan sets
            env = {**runtime.device_env(self.plan, devices), **env}
        env.update(worker_markers(self.job.name, self.run_id, slot.index))  # not the job's to override
        return WorkerLaunch(
            job=self.job.name, run_id=self.run_id, generation=self.generation, slot=slot,
            tf_config=tf_config_json(self.slots, slot.index),
            argv=worker_argv(self.job, paths, self._script_rel()), cwd=worker_cwd(paths), python=paths.python,
            code_dir=code_dir, output_dir=runtime.out_dir(self.run_id, slot.label),
            env=env, image=self.job.image, data_dir=self.job.data_dir,
            device_ids=tuple(docker_device_ids(devices)) if devices else None,
        )

    def _config_dir(self) -> Path:
        """Where the job's relative paths start: the cluster file's folder (the embedded default: here)."""
        source = self.cluster.spec.source
        return Path.cwd() if source == EMBEDDED_DEFAULT else Path(source).parent

    def _local_code(self) -> Path:
        if self.job.uses_trainer:
            return Path(str(resources.files("homegpu.trainer")))
        return (self._config_dir() / (self.job.code_dir or Path(self.job.script).parent)).expanduser().resolve()

    def _script_rel(self) -> str:
        if self.job.uses_trainer:
            return ""
        script = (self._config_dir() / self.job.script).expanduser().resolve()
        return script.relative_to(self._local_code()).as_posix()

    # -- launch --------------------------------------------------------------------------------

    async def launch(self) -> None:
        """Preflight every node, ship the code, start every worker — or leave nothing running.

        Raises:
            LaunchError: naming each node that is not ready and what to do.
        """
        self._start_record()
        try:
            self._publish(JobState.PREFLIGHT)
            await self.prepare()
            self.record.describe_setup(self.job, {s.label: tf_config_json(self.slots, s.index) for s in self.slots})
            await self._preflight()
            self._publish(JobState.PREFLIGHT, f"syncing code to {len(self._nodes())} node(s)")
            await self._sync_code()
            self.experiment = ExperimentLog(self.experiments_root, self.run_id)
            try:
                await self._start_generation()
            except LaunchError:
                self._publish(JobState.FAILED, "start failed")
                raise
        except BaseException:
            await self.record.close()
            raise

    def _start_record(self) -> None:
        nodes = [slot.node.name for slot in self.slots]
        self.record = RunRecord(self.cluster, self.experiments_root / self.run_id, nodes, self.run_id,
                                self.job.name).start()

    async def _preflight(self) -> None:
        first = {slot.node.name: slot for slot in reversed(self.slots)}
        ports = {name: [s.port for s in self.slots if s.node.name == name] for name in first}
        results = await asyncio.gather(*(
            node_preflight(self.tracks[slot.label].runtime, self.launch_for(slot), self.job, self._local_code(),
                           ports[name])
            for name, slot in first.items()))
        if not any(results):  # each node ready by itself: now prove the network between them
            results = await self._reach_problems(first, ports, results)
        problems = []
        for slot, found in zip(first.values(), results):
            stats = self.cluster.node(slot.node.name).latest
            gpus = describe_gpus(stats) + (f" ({stats.source})" if stats and stats.gpus else "")
            warnings = foreign_memory_warnings(slot.node.name, stats, self._job_gpus(slot.node.name), self.run_id)
            self.hub.publish(PreflightResult(self.job.name, slot.node.name, tuple(found), gpus, tuple(warnings)))
            problems += found
        if problems:
            self._publish(JobState.FAILED, "preflight failed")
            raise LaunchError("; ".join(problems))

    async def _reach_problems(self, first: dict[str, WorkerSlot], ports: dict[str, list[int]],
                              results: list[list[str]]) -> list[list[str]]:
        """`results` with what keeps each node's job ports from being reached by its peers."""
        ends = [Endpoint(self.cluster.node(name), slot.address, tuple(ports[name])) for name, slot in first.items()]
        found = await reach_problems(ends)
        return [found_here + [p.text for p in found if p.node == name]
                for name, found_here in zip(first, results)]

    def _job_gpus(self, node: str) -> list[int] | None:
        """The GPU indices the device plan gives the job's workers on `node`; None (all) without a plan."""
        if self.plan is None:
            return None
        return [gpu for worker in self.plan.workers_on(node) for gpu in worker.gpus]

    async def _port_problems(self) -> list[str]:
        """The job ports each node cannot bind now (the stopped generation's, say, not yet free)."""
        first = {slot.node.name: slot for slot in reversed(self.slots)}
        found = await asyncio.gather(*(
            port_problems(self.tracks[slot.label].runtime, slot.address,
                          [s.port for s in self.slots if s.node.name == name]) for name, slot in first.items()),
            return_exceptions=True)
        return [p for item in found for p in ([str(item)] if isinstance(item, BaseException) else item)]

    # -- the run lock ---------------------------------------------------------------------------

    def _lock_place(self) -> tuple[NodeSession, str]:
        chief = self.slots[0].node.name
        return self.cluster.node(chief), self.nodes.work_dirs[chief]

    async def take_lock(self) -> LockHolder | None:
        """Take the job's run lock on the chief's node; the holder when another controller has it.

        Raises:
            LaunchError: the lock could not be read or written (node gone, no python there).
        """
        node, work_dir = self._lock_place()
        try:
            result = await acquire(node, work_dir, self.job.name, self.run_id)
        except (RunLockError, *NODE_GONE) as exc:
            raise LaunchError(str(exc)) from None
        self._locked = result.acquired
        return None if result.acquired else result.holder

    async def release_lock(self) -> None:
        if self._locked:
            self._locked = False
            with contextlib.suppress(RunLockError, *NODE_GONE):
                await release(*self._lock_place(), self.job.name, self.run_id)

    async def _heartbeat(self) -> None:
        if self._locked and time.monotonic() - self._last_heartbeat > HEARTBEAT_SECONDS:
            self._last_heartbeat = time.monotonic()
            with contextlib.suppress(RunLockError, *NODE_GONE):
                await refresh(*self._lock_place(), self.job.name, self.run_id)

    async def _sync_code(self) -> None:
        local = self._local_code()
        async def one(node: NodeSession) -> None:
            target = self.code_dir(node.name)
            if self.job.uses_trainer:  # ship homegpu/trainer so nodes need no homegpu install
                target = f"{target}/{TRAINER_PACKAGE_DIR}/homegpu/trainer"
            await sync_tree(node, local, target)
        results = await asyncio.gather(*(one(node) for node in self._nodes()), return_exceptions=True)
        problems = [str(r) for r in results if isinstance(r, (SyncError, *NODE_GONE))]
        if problems:
            raise LaunchError("code sync failed: " + "; ".join(problems))
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _start_generation(self) -> None:
        self._publish(JobState.STARTING, f"starting TensorFlow on {len(self.slots)} worker(s)")
        launches = [self.launch_for(slot) for slot in self.slots]
        results = await asyncio.gather(*(self.tracks[l.label].runtime.start(l) for l in launches),
                                       return_exceptions=True)
        failed = [(l, r) for l, r in zip(launches, results) if isinstance(r, BaseException)]
        if failed:
            await self._stop_workers()
            raise LaunchError("; ".join(_describe_failure(l, r) for l, r in failed))
        self._follow_logs()
        self._publish(JobState.RUNNING)

    # -- reattach ------------------------------------------------------------------------------

    def adopt(self, run_id: str, generation: int) -> None:
        """Take over a run started by another homegpu process: follow it, never start it twice."""
        self.run_id, self.generation = run_id, generation
        self.experiment = ExperimentLog(self.experiments_root, run_id)
        self._start_record()
        self._follow_logs()
        self._publish(JobState.RUNNING, "attached to a running job")

    # -- watch ---------------------------------------------------------------------------------

    async def watch(self) -> RunOutcome:
        """Follow the run until it succeeds, fails for good, or stop() is called; then read every
        worker's log to its end and fetch the chief's outputs."""
        try:
            state, detail = await self._follow_to_end()
        except BaseException:
            await self._stop_tails()
            self._close_experiment()
            await self._close_record(report=False)
            raise
        incomplete = await self._finish_tails()
        outputs = await self._fetch_outputs()
        if state is JobState.SUCCEEDED and self.job.uses_trainer and not outputs.error:
            await remove_backups([(t.runtime.node, t.runtime.out_dir(self.run_id, t.label))
                                  for t in self.tracks.values()])
        self._close_experiment()
        outcome = self._finish(state, detail, incomplete, outputs)
        await self.release_lock()
        return replace(outcome, report=await self._close_record())

    async def _follow_to_end(self) -> tuple[JobState, str]:
        while True:
            if self._stop_requested.is_set():
                self._publish(JobState.STOPPING, f"TERM to every worker, KILL after {STOP_GRACE_SECONDS:g} s")
                await self._stop_workers()
                return JobState.STOPPED, "stopped"
            failure = await self._check_workers()
            if failure is None:
                if all(t.status and t.status.state == "exited" and t.status.exit_status == 0
                       for t in self.tracks.values()):
                    return JobState.SUCCEEDED, "every worker succeeded"
            elif (failure := await self._restart(failure)) is not None:
                return JobState.FAILED, failure
            await self._heartbeat()
            await self._sleep(POLL_SECONDS)

    def _close_experiment(self) -> None:
        if self.experiment:
            self.experiment.close()

    async def _close_record(self, report: bool = True) -> tuple[Path | None, str]:
        if self.record is None:
            return None, "no record"
        record, self.record = self.record, None
        return await record.close(report)

    async def detach(self) -> None:
        """Leave the run going on its nodes and stop following it here."""
        await self._stop_tails()
        self._close_experiment()
        await self._close_record(report=False)

    def stop(self) -> None:
        """Ask watch() to stop every worker (TERM, a grace period, then KILL) and end the run."""
        self._stop_requested.set()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop_requested.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def _judge_failure(self) -> Verdict | None:
        """A script error (every worker failed by itself before any progress, with the same error) is
        not a fault: restarting cannot fix it. The other workers get SCRIPT_ERROR_WAIT seconds to end
        by themselves first, since stopping them would hide their own error. None: a fault."""
        if not any(might_be_script_error(end) for end in self._worker_ends()):
            return None
        deadline = time.monotonic() + SCRIPT_ERROR_WAIT
        while time.monotonic() < deadline and not all(
                t.status and t.status.state in ("exited", "vanished") for t in self.tracks.values()):
            await self._sleep(POLL_SECONDS)
            for track, status in zip(*await self._poll_workers()):
                if isinstance(status, WorkerStatus):
                    self._note_status(track, status)
        await self._finish_tails()  # every worker's own last lines, to compare their errors
        return judge(self._worker_ends())

    def _worker_ends(self) -> list[WorkerEnd]:
        return [WorkerEnd(t.label, t.status.exit_status if t.status else None,
                          progressed=t.progressed, last_lines=tuple(line.text for line in t.tail.lines)[-60:]
                          if t.tail else (), stopped=not (t.status and t.status.state in ("exited", "vanished")))
                for t in self.tracks.values()]

    async def _check_workers(self) -> str | None:
        """Poll every worker; a description of the failure or stall that ends this generation, else None.

        Every status is noted first, and a worker killed by a signal is named before one that failed
        by itself: when one worker is killed, its peers fail too, and the kill is the cause.
        """
        tracks, statuses = await self._poll_workers()
        for track, status in zip(tracks, statuses):
            if isinstance(status, BaseException):
                if not isinstance(status, (*NODE_GONE, RuntimeError_)):
                    raise status
            else:  # node unreachable right now: the stall clock keeps running
                self._note_status(track, status)
        failed = [t for t in tracks if t.status and t.status.state in ("exited", "vanished")
                  and t.status.exit_status != 0]
        if failed:
            cause = min(failed, key=lambda t: not _killed(t.status.exit_status))
            return f"{cause.label}: {classify_exit(cause.status.exit_status)}"
        now = time.monotonic()
        for track in tracks:
            finished = track.status is not None and track.status.state == "exited"
            if not finished and now - track.last_activity > self.job.stall_timeout:
                return f"{track.label}: no progress for {self.job.stall_timeout:g}s (stalled)"
        return None

    async def _poll_workers(self) -> tuple[list[WorkerTrack], list[WorkerStatus | BaseException]]:
        """Every worker's status, one round trip per node; a node's failure stands for each of its
        workers."""
        by_runtime: dict[Runtime, list[WorkerTrack]] = {}
        for track in self.tracks.values():
            by_runtime.setdefault(track.runtime, []).append(track)
        groups = list(by_runtime.values())
        replies = await asyncio.gather(*(group[0].runtime.statuses(self.run_id, [t.label for t in group])
                                         for group in groups), return_exceptions=True)
        tracks, statuses = [], []
        for group, reply in zip(groups, replies):
            tracks += group
            statuses += [reply] * len(group) if isinstance(reply, BaseException) else reply
        return tracks, statuses

    def _note_status(self, track: WorkerTrack, status: WorkerStatus) -> None:
        if status.generation not in (None, self.generation):
            return  # a previous generation's leftovers
        changed = track.status is None or track.status.state != status.state
        track.status = status
        if changed and status.state in ("exited", "vanished"):
            self.hub.publish(WorkerExited(self.job.name, self.run_id, track.label, self.generation,
                                          status.exit_status, classify_exit(status.exit_status)))

    def _retry_is_pointless(self) -> bool:
        """The built-in trainer exits 2 (bad options, TF_CONFIG or data) or 3 (backups disagree)
        for what a restart cannot fix."""
        return self.job.uses_trainer and any(
            t.status and t.status.exit_status in (2, 3) for t in self.tracks.values())

    async def _restart(self, failure: str) -> str | None:
        """Restart every worker with the next generation, with backoff, while restarts are left.

        A restart whose start fails (a node went away, say) uses up a restart too. Returns None
        once the workers run again, else why the run failed for good.
        """
        verdict = await self._judge_failure()
        if verdict is not None and verdict.script_error:
            await self._stop_workers()
            return verdict.summary
        while True:
            if self.job.restart != "on-failure" or self.restarts >= self.job.max_restarts \
                    or self._retry_is_pointless():
                await self._stop_workers()
                return failure
            self.restarts += 1
            self._publish(JobState.RESTARTING, failure)
            await self._stop_workers()
            await self._finish_tails()  # the failed generation's whole log, before a removed container's is gone
            await self._remove_workers()
            await self._sleep(min(2.0 ** (self.restarts - 1), MAX_BACKOFF_SECONDS))
            if self._stop_requested.is_set():
                return None  # watch() stops what is left
            problems = await self._port_problems()
            if problems:
                failure = f"restart failed: {'; '.join(problems)}"
                continue
            self.generation += 1
            for track in self.tracks.values():
                track.status, track.last_activity, track.progressed = None, time.monotonic(), False
            try:
                await self._start_generation()
                return None
            except LaunchError as exc:
                failure = f"restart failed: {exc}"

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

    # -- logs and metrics ----------------------------------------------------------------------

    def _follow_logs(self) -> None:
        for track in self.tracks.values():
            track.last_activity = time.monotonic()
            track.tail = track.runtime.tail(self.run_id, track.label, self.generation, hub=self.hub,
                                            on_line=self._on_line(track), worker=track.label,
                                            batch_size=self.job.batch_size if self.job.uses_trainer else None).start()

    def _on_line(self, track: WorkerTrack):
        def take(line: LogLine) -> None:
            track.last_activity = time.monotonic()
            if self.experiment:
                self.experiment.log_line(track.label, line.text)
            data = line.metric
            if data is not None and data.get("event") in PROGRESS_EVENTS:
                track.progressed = True
            if data is not None:
                if data.get("event") in ("epoch", "end"):  # the summary's figures: the latest of each
                    track.last_metric = {**track.last_metric, **data}
                if self.experiment:
                    self.experiment.metric(track.label, data)
                self.hub.publish(Metric(self.job.name, self.run_id, track.label, track.slot.index, data))
                if data.get("event") == "epoch" and data.get("epoch", 0) >= 2:  # epoch 1 includes warm-up
                    self._check_stragglers(data["epoch"])
        return take

    def _check_stragglers(self, epoch: int) -> None:
        """Compare the workers' rates for `epoch` once every worker has reported it: examples/s,
        else steps/s (Keras's own output gives steps; examples need the script's batch size)."""
        for key, unit in (("examples_per_sec", "examples/s"), ("steps_per_sec", "steps/s")):
            rates = {t.label: float(t.last_metric[key]) for t in self.tracks.values()
                     if t.last_metric.get("epoch") == epoch and isinstance(t.last_metric.get(key), (int, float))}
            if len(rates) == len(self.tracks):
                for worker, median in find_stragglers(rates):
                    self.hub.publish(Straggler(self.job.name, self.run_id, worker, rates[worker], median, unit=unit,
                                               epoch=epoch))
                return

    async def _stop_tails(self) -> None:
        await asyncio.sleep(0.3)  # let the last lines of an ended worker arrive
        await asyncio.gather(*(t.tail.stop() for t in self.tracks.values() if t.tail))

    async def _finish_tails(self) -> tuple[str, ...]:
        """Read every ended worker's log to its last byte; "WORKER: where the full log is" for each
        that could not be (its node gone)."""
        tracks = [t for t in self.tracks.values() if t.tail]
        done = await asyncio.gather(*(t.tail.finish(LOG_DRAIN_SECONDS) for t in tracks))
        return tuple(f"{t.label}: the full log is on {t.slot.node.name} in "
                     f"{t.runtime.run_dir(self.run_id)}" for t, complete in zip(tracks, done) if not complete)

    # -- end -----------------------------------------------------------------------------------

    async def _fetch_outputs(self) -> FetchedOutputs:
        """What the chief wrote in its output dir, into experiments/RUN-ID/output/ (not its backups)."""
        if not self.experiment:
            return FetchedOutputs()
        chief = self.tracks[self.slots[0].label]
        self._publish(self.state, "fetching the chief's outputs")
        return await fetch_outputs(chief.runtime.node, chief.runtime.out_dir(self.run_id, chief.label),
                                   self.experiment.output_dir)

    def _finish(self, state: JobState, detail: str, incomplete: tuple[str, ...] = (),
                outputs: FetchedOutputs = FetchedOutputs()) -> RunOutcome:
        self._publish(state, detail)
        return RunOutcome(state, detail, tuple((t.label, t.status, t.last_metric) for t in self.tracks.values()),
                          incomplete, outputs)

    def _publish(self, state: JobState, detail: str = "") -> None:
        self.state = state
        self.hub.publish(JobStateChanged(self.job.name, self.run_id, state, self.generation, self.restarts, detail))


async def attach_if_running(run: JobRun) -> bool:
    """Attach `run` to its job if that already runs on its nodes; True when it did. Raises LaunchError."""
    await run.prepare()
    active = await run.nodes.find()
    if active:
        run.adopt(*active)
    return bool(active)


async def launch_or_attach(run: JobRun) -> bool:
    """Attach `run` to its job if that already runs on its nodes, else launch it.

    Returns True when it attached (nothing new was started). Raises LaunchError.
    """
    if await attach_if_running(run):
        return True
    holder = await run.take_lock()
    if holder is not None:
        return await _attach_once_started(run, holder)
    try:
        await run.launch()
    except BaseException:
        await run.release_lock()
        raise
    return False


async def _attach_once_started(run: JobRun, holder: LockHolder) -> bool:
    """Another controller holds the job's lock: its launch is under way. Attach to it once its
    workers run, rather than start the job a second time. Raises LaunchError when none appear."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        if await attach_if_running(run):
            return True
    raise LaunchError(f"{run.job.name} is being started by {holder.describe()}, whose workers did not "
                      f"appear within {LOCK_WAIT_SECONDS:g} s; wait for it, or stop it: homegpu stop {run.job.name}")


def _killed(exit_status: int | None) -> bool:
    """Ended by a signal: a negative status (a process), or 128 + N (a container's shell)."""
    return exit_status is not None and (exit_status < 0 or 128 < exit_status < 160)


def _describe_failure(launch: WorkerLaunch, error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if launch.slot.node.name in text else f"{launch.slot.node.name}: {text}"
