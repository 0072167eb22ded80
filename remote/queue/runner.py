"""The queue's runner, inside `homegpu serve`: it starts waiting entries when schedule.decide says so,
through the same path as `homegpu run` (JobRun: the job's lock, preflight, code sync, launch), follows each
run to its end, and finishes its entry.

One start, in order (nothing is recorded until the launch is sure to be tried):
1. the run is prepared (its nodes reached, its workers laid out on their GPUs);
2. the job must not already run outside the queue, and every node's GPUs are checked again on a stats
   sample taken after the decision (a process that came in between makes it wait again);
3. the job's lock is taken, then the entry is marked starting with the run's id (store.py says why first);
4. the launch; the entry is running once every worker started, failed with the launch's own words if not.

When serve stops, the runs go on: the runner stops following them and leaves their entries running. A
serve started again resumes them (resume.py): it attaches to a run whose workers are still there, else
finishes the entry with what its workers' exit statuses say. Nothing is ever started twice.

A write to the queue's file that fails (a full disk) is said once (`say`) and never kills the runner: a
start that could not be recorded is not launched (the entry waits); a run launched whose "running" could
not be recorded is followed all the same; an end that could not be recorded is tried again each pass,
its entry's nodes held meanwhile. The first write that succeeds after failures says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Callable, Mapping

from homegpu.remote.config import AUTO, MAX_PORT, ClusterSpec, JobSpec, size_text
from homegpu.remote.events import JobState, NodeStats, QueueRunChanged
from homegpu.remote.jobs import JobRun, LaunchError, RunOutcome
from homegpu.remote.nodes import Cluster, wait_set
from homegpu.remote.placement import Placement, make_placement
from homegpu.remote.plan import auto_gpu_memory, last_timeline
from homegpu.remote.record import ReportError, read_manifest
from homegpu.remote.queue.cluster_file import ClusterFile
from homegpu.remote.queue.desk import QueueDesk
from homegpu.remote.queue.entries import EntryState, QueueEntry, QueueError, QueueWriteError
from homegpu.remote.queue.overrides import apply_overrides
from homegpu.remote.queue.resume import ATTACH, resume_action
from homegpu.remote.queue.schedule import Decision, NodeView, decide, entry_nodes
from homegpu.remote.queue.store import QueueStore
from homegpu.remote.sleep_wake import is_progress_tick
from homegpu.remote.store import Say, WriteTrouble, say_on_stderr

TICK_SECONDS = 2.0  # how often the queue is looked at without a change to prompt it
FRESH_STATS_INTERVALS = 3  # stats intervals to wait for a sample newer than the decision
_ENDS = {JobState.SUCCEEDED: EntryState.SUCCEEDED, JobState.STOPPED: EntryState.CANCELLED}


class QueueRunner:
    """Runs `store`'s queue on `cluster`, recording runs under `experiments`; start() it, close() it.
    `desk` answers the socket's requests (QueueDesk) with this runner behind it."""

    def __init__(self, cluster: Cluster, store: QueueStore, experiments: Path,
                 clock: Callable[[], float] = time.time, tick: float = TICK_SECONDS, say: Say = say_on_stderr) -> None:
        self.cluster, self.store, self.say = cluster, store, say
        self.cluster_file = ClusterFile(cluster.spec, say)
        self.experiments, self.clock, self.tick = Path(experiments), clock, tick
        self.desk = QueueDesk(self.cluster_file, store, changed=self.wake, stop_run=self._stop_run, clock=clock)
        self._wake = asyncio.Event()
        self._starting: dict[str, QueueEntry] = {}  # entries between their decision and their record
        self._runs: dict[str, JobRun] = {}  # entry id -> its run, while followed
        self._cancelled_by: dict[str, str] = {}  # entry id -> who cancelled its run
        self._placed: dict[str, str] = {}  # entry id -> its run's id in the placement's queue (a Slurm job), until it ends
        self._pinned: dict[str, Mapping[str, int]] = {}  # entry id -> node -> its GPU, for a run sharing cards
        self._auto_budgets: dict[str, int] = {}  # entry id -> its gpu_memory = "auto", read once from the last run
        self._ports: dict[str, tuple[frozenset[str], range]] = {}  # entry id -> a sharing run's nodes and ports
        self._unresumed: set[str] = set()  # active entries whose nodes did not answer yet
        self._unrecorded_ends: dict[str, tuple[EntryState, str, float]] = {}  # ends the file did not take yet
        self.trouble = WriteTrouble(say, clock)
        self._tasks: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None

    # -- life ------------------------------------------------------------------------------------

    @property
    def spec(self) -> ClusterSpec:
        """The cluster as its file says now (cluster_file.py)."""
        return self.cluster_file.spec

    def start(self) -> QueueRunner:
        self._unresumed = {entry.id for entry in self.store.unfinished()}
        self._loop_task = asyncio.create_task(self._loop(), name="queue runner")
        return self

    async def close(self) -> None:
        """Stop starting runs and stop following them; the runs themselves go on (a restart resumes them)."""
        tasks = [task for task in (self._loop_task, *self._tasks) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def wake(self) -> None:
        """Look at the queue now (a submit, a cancel, a run's end)."""
        self._wake.set()

    def owns(self, run_id: str) -> bool:
        """Whether run `run_id` is one of the queue's (serve's run follower leaves those alone)."""
        return any(entry.run_id == run_id for entry in self.store.unfinished())

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            await self._resume()
            self._pass()
            await wait_set(self._wake, self.tick)

    def _spawn(self, coroutine, name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- deciding --------------------------------------------------------------------------------

    def _views(self) -> dict[str, NodeView]:
        return {name: NodeView(node.state, node.latest) for name, node in self.cluster.nodes.items()}

    def _needs(self, entries: list[QueueEntry]) -> dict[str, tuple[str, ...]]:
        """entry id -> its run's nodes (`--set` cannot change them: overrides.py). None where the placement places
        nodes (Slurm): which nodes a run gets, and when, is its to decide, so each entry starts once its --after
        allows."""
        places_nodes = self._placement().places_nodes
        return {e.id: () if places_nodes else entry_nodes(self.spec, self.spec.jobs[e.job])
                for e in entries if e.job in self.spec.jobs}

    def _placement(self) -> Placement:
        return make_placement(self.spec)

    def _entries(self) -> list[QueueEntry]:
        """The store's entries, those being started counted as starting (their nodes are taken)."""
        return [replace(e, state=EntryState.STARTING) if e.id in self._starting and e.state is EntryState.WAITING
                else e for e in self.store.entries()]

    def _decide(self, entries: list[QueueEntry]) -> Decision:
        """schedule.decide on the entries as they are now. Where the placement places nodes (Slurm) an entry whose
        --after entries are all in its queue may be started at once: the placement's dependency on them holds it."""
        if self._placement().places_nodes:
            entries = [replace(e, after=tuple(a for a in e.after if a not in self._placed)) if e.after else e
                       for e in entries]
        return decide(entries, self._views(), self._needs(entries), budgets=self._budgets(entries), placed=self._pinned)

    def _budgets(self, entries: list[QueueEntry]) -> dict[str, int]:
        """entry id -> the bytes each process of its run holds on its GPU (its job's gpu_memory, "auto" read
        from the job's last run once), for the waiting and active entries whose job has one."""
        budgets = {}
        for entry in entries:
            job = self.spec.jobs.get(entry.job)
            if job is None or entry.state.finished:
                continue
            if entry.overrides:
                with contextlib.suppress(QueueError):
                    job = apply_overrides(self.spec, job, entry.overrides)
            if job.gpu_memory == AUTO and entry.id not in self._auto_budgets:
                self._auto_budgets[entry.id] = auto_gpu_memory(last_timeline(self.experiments, job.name))[0]
            budget = self._auto_budgets.get(entry.id, 0) if job.gpu_memory == AUTO else job.gpu_memory
            if budget:
                budgets[entry.id] = budget
        return budgets

    def _pass(self) -> None:
        self._record_ends()
        self.cluster.spec = self.cluster_file.check()  # an edit that changed only jobs is taken at once
        entries = self._entries()
        now = self.clock()
        if self.cluster_file.refusal:  # the file changed in a way serve cannot take: nothing more starts
            self._note_reasons({e.id: self.cluster_file.refusal for e in entries if e.state is EntryState.WAITING})
            return
        for entry in entries:
            if entry.state is EntryState.WAITING and entry.job not in self.spec.jobs:
                self._cancel(entry.id, f"job {entry.job} is no longer in {self.spec.source}", now)
        entries = self._entries()
        decision = self._decide(entries)
        for id_, reason in decision.cancels.items():
            self._cancel(id_, reason, now)
        self._note_reasons(decision.waits)
        by_id = {entry.id: entry for entry in entries}
        for id_ in decision.start:
            self._starting[id_] = by_id[id_]
            if id_ in decision.gpus:
                self._pinned[id_] = decision.gpus[id_]
            self._spawn(self._start(by_id[id_]), f"queue start {id_}")

    def _tell(self, entry: QueueEntry, state: str, reason: str = "") -> None:
        self.cluster.hub.publish(QueueRunChanged(entry.id, entry.job, entry.run_id, state, reason,
                                                 settings=entry.overrides))

    # -- starting --------------------------------------------------------------------------------

    async def _start(self, entry: QueueEntry) -> None:
        try:
            run = await self._ready_run(entry)
            if run is not None:
                await self._launch(entry, run)
        finally:
            self._starting.pop(entry.id, None)
            self.wake()

    async def _ready_run(self, entry: QueueEntry) -> JobRun | None:
        """Steps 1-3 of a start (the module's docstring): the run with its lock held, or None after noting
        why the entry waits (or cancelling it, if its settings no longer apply)."""
        job = self._job(entry)
        if job is None:
            return None
        run = self._new_run(entry, self._own_ports(entry, job))
        decided = self._samples(entry)
        try:
            await run.prepare(waking=lambda line: self._waking(entry, line))
            other = await run.nodes.find(running_only=True)
            if other is not None and not (entry.id in self._pinned and self.owns(other[0])):
                return await self._not_yet(entry, run, f"job {job.name} already runs as run {other[0]}, started "
                                                       "outside the queue; it starts after that run ends")
            blocked = await self._gpus_taken(entry, decided)
            if blocked:
                return await self._not_yet(entry, run, blocked)
            holder = await run.take_lock()
        except LaunchError as exc:
            return await self._not_yet(entry, run, f"not started yet: {exc}")
        if holder is not None:
            return await self._not_yet(entry, run, f"job {job.name} is being started by {holder.describe()}")
        return run

    def _new_run(self, entry: QueueEntry, job: JobSpec) -> JobRun:
        """The entry's run, placed with its priority (Slurm's nice), its --after entries' placed runs as its
        dependency, and its own placed id noted once it has one (for the entries that wait --after it)."""
        after = tuple(self._placed[after] for after in entry.after if after in self._placed)
        placement = self._placement().for_run(self.cluster, entry.priority, after,
                                              lambda job_id: self._placed.__setitem__(entry.id, job_id))
        return JobRun(self.cluster, job, self.experiments, placement=placement, pinned=self._pinned.get(entry.id),
                      instance=self._instance(entry))

    def _instance(self, entry: QueueEntry) -> str:
        """A run sharing cards is one of several runs of its job at once: its lock and code copy are its own
        ("sweep.q-5"); any other run is the job's one run ("" : its name)."""
        return f"{entry.job}.{entry.id}" if entry.id in self._pinned else ""

    async def _not_yet(self, entry: QueueEntry, run: JobRun, reason: str) -> None:
        """The entry waits, for `reason`: what its run placed (a Slurm job submitted) is let go (the next try places
        anew)."""
        await run.cancel_placement()
        self._placed.pop(entry.id, None)
        self._forget_cards(entry.id)
        self._wait(entry, reason)

    def _own_ports(self, entry: QueueEntry, job: JobSpec) -> JobSpec:
        """A run sharing cards gets ports of its own: the job's, moved past those of the queue's other sharing runs
        on any of its nodes (jobs left at the default port all have 23456, and two runs on one node cannot both
        listen there). A whole-GPU run has its nodes to itself and keeps the job's port."""
        if entry.id not in self._pinned:
            return job
        nodes, width = frozenset(self._needs([entry]).get(entry.id, ())), job.most_workers_per_node
        taken = [ports for id_, (used, ports) in self._ports.items() if id_ != entry.id and used & nodes]
        port = job.port
        while any(port < ports.stop and ports.start < port + width for ports in taken):
            port += width
        if port + width - 1 > MAX_PORT:
            return job  # out of ports to move to: the launch says the port is in use
        return self._keep_ports(entry, job, port)

    def _keep_ports(self, entry: QueueEntry, job: JobSpec, port: int) -> JobSpec:
        """`job` on ports from `port` on, noted as the sharing run's on its nodes."""
        self._ports[entry.id] = (frozenset(self._needs([entry]).get(entry.id, ())),
                                 range(port, port + job.most_workers_per_node))
        return replace(job, port=port)

    def _forget_cards(self, id_: str) -> None:
        """A sharing run's GPUs and ports, let go (it waits again, or ended)."""
        self._pinned.pop(id_, None)
        self._ports.pop(id_, None)

    def _job(self, entry: QueueEntry) -> JobSpec | None:
        """The entry's job with its `--set` applied; None (and the entry cancelled) when they no longer apply."""
        try:
            return apply_overrides(self.spec, self.spec.jobs[entry.job], entry.overrides)
        except (KeyError, QueueError) as exc:
            reason = (f"job {entry.job} is no longer in {self.spec.source}" if isinstance(exc, KeyError)
                      else f"its settings no longer apply: {exc}")
            self._cancel(entry.id, reason, self.clock())
            return None

    def _cancel(self, id_: str, reason: str, now: float) -> None:
        """Cancel a waiting entry (the next pass tries again if the file could not take it)."""
        try:
            entry = self.store.cancel(id_, reason, now)
        except QueueWriteError as exc:
            self.trouble.failed(str(exc), "entries are cancelled when it can write again")
            return
        except QueueError:  # cancelled by hand meanwhile
            return
        self._wrote()
        self._tell(entry, "cancelled", reason)

    def _waking(self, entry: QueueEntry, step: str) -> None:
        """A step of getting the entry's nodes ("waking n2: 25 s of up to 120 s"): why it waits, and in serve's log
        each step but the wait's ticks, so the log says when and how the queue woke a machine."""
        self._wait(entry, step)
        if not is_progress_tick(step):
            self.say(f"queue: {entry.id} ({entry.job}): {step}")

    def _wait(self, entry: QueueEntry, reason: str) -> None:
        self._note_reasons({entry.id: reason})
        return None

    def _note_reasons(self, reasons: dict[str, str], state: EntryState = EntryState.WAITING) -> None:
        try:
            changed = self.store.note_reasons(reasons, state)
        except QueueWriteError as exc:
            self.trouble.failed(str(exc), "why entries wait is not kept until it can write again")
            return
        if changed:  # a write that changed nothing needed no room: it says nothing of the disk
            self._wrote()

    def _wrote(self) -> None:
        """A write went through: the file is written again, unless a run's end still waits to be."""
        if not self._unrecorded_ends:
            self.trouble.succeeded(f"the queue {self.store.path}")

    def _samples(self, entry: QueueEntry) -> dict[str, NodeStats | None]:
        """The stats samples the decision to start `entry` saw, by node."""
        return {name: self.cluster.node(name).latest for name in self._needs([entry])[entry.id]}

    async def _gpus_taken(self, entry: QueueEntry, decided: dict[str, NodeStats | None]) -> str:
        """Why the entry's GPUs are not free on a stats sample newer than those `decided` on ("" when they are)."""
        await asyncio.gather(*(self._fresh_stats(name, seen) for name, seen in decided.items()))
        decision = self._decide([e for e in self._entries() if e.id != entry.id] + [entry])
        if entry.id not in decision.start:
            return decision.waits.get(entry.id, "not its turn any more")
        if decision.gpus.get(entry.id, {}) != self._pinned.get(entry.id, {}):
            return "the GPU it was given has less room now; it is placed again"
        return ""

    async def _fresh_stats(self, name: str, seen: NodeStats | None) -> None:
        """Wait for a sample of `name` other than `seen` (a few stats intervals at most: a node whose agent
        stalled is judged on what it last sent)."""
        wait = FRESH_STATS_INTERVALS * self.spec.stats_interval
        with contextlib.suppress(asyncio.TimeoutError):
            await self.cluster.node(name).wait_for(lambda node: node.latest is not seen, timeout=wait)

    async def _launch(self, entry: QueueEntry, run: JobRun) -> None:
        try:
            entry = self.store.mark_starting(entry.id, run.run_id, self.clock())
        except QueueError as exc:  # cancelled while it was prepared, or not recorded: then not launched
            await run.release_lock()
            if isinstance(exc, QueueWriteError):
                self.trouble.failed(str(exc), "no queued run starts until its start can be recorded")
            return
        self._wrote()
        self._tell(entry, "started")
        try:
            await run.launch()
        except LaunchError as exc:
            await run.release_lock()
            self._end(entry, EntryState.FAILED, f"not started: {exc}")
            return
        except asyncio.CancelledError:
            await run.release_lock()
            raise
        except Exception as exc:  # a bug of homegpu's: the entry fails, saying so, and serve goes on
            await run.release_lock()
            self.say(f"queue: {entry.id} ({entry.job}) not started, by an error homegpu did not expect:\n"
                     + "".join(traceback.format_exception(exc)).rstrip())
            self._end(entry, EntryState.FAILED, f"not started: homegpu failed ({type(exc).__name__}: {exc}); "
                                                "serve's log has the details")
            return
        self._follow(self._mark_running(entry), run)
        self._note_where(entry)

    def _note_where(self, entry: QueueEntry) -> None:
        """A run sharing cards: where it runs and its budget, as `homegpu queue` shows it ("on desktop GPU 0 with
        5.0 GiB")."""
        pinned, budget = self._pinned.get(entry.id), self._budgets([entry]).get(entry.id)
        if pinned and budget:
            cards = ", ".join(f"{node} GPU {index}" for node, index in pinned.items())
            self._note_reasons({entry.id: f"on {cards} with {size_text(budget)}"}, EntryState.RUNNING)

    def _mark_running(self, entry: QueueEntry) -> QueueEntry:
        """The entry, running; in memory only when the file could not take it (its run is followed all the
        same, and its end is recorded from `starting` as well)."""
        try:
            return self.store.mark_running(entry.id)
        except QueueWriteError as exc:
            self.trouble.failed(str(exc), f"{entry.id}'s run is followed and its end recorded when it can be")
            return replace(entry, state=EntryState.RUNNING)

    # -- following -------------------------------------------------------------------------------

    def _follow(self, entry: QueueEntry, run: JobRun) -> None:
        self._runs[entry.id] = run
        run.on_regroup = lambda line: self._note_reasons({entry.id: line}, EntryState.RUNNING)
        if entry.id in self._cancelled_by:
            run.stop()
        self._spawn(self._watch(entry, run), f"queue run {entry.id}")

    async def _watch(self, entry: QueueEntry, run: JobRun) -> None:
        try:  # cancelled when serve stops: watch() stops following, the run goes on, a restart resumes it
            outcome = await run.watch()
        finally:
            self._runs.pop(entry.id, None)
        state, reason = self._outcome(entry, outcome)
        self._end(entry, state, reason)
        self.wake()

    def _outcome(self, entry: QueueEntry, outcome: RunOutcome) -> tuple[EntryState, str]:
        state = _ENDS.get(outcome.state, EntryState.FAILED)
        if state is EntryState.CANCELLED:
            user = self._cancelled_by.get(entry.id, "")
            return state, f"cancelled by {user} while it ran" if user else "stopped outside the queue"
        return state, "" if state is EntryState.SUCCEEDED else outcome.detail

    def _end(self, entry: QueueEntry, state: EntryState, reason: str) -> None:
        self._cancelled_by.pop(entry.id, None)  # a cancel asked during a launch that failed is done with too
        self._placed.pop(entry.id, None)  # one waiting --after it is judged by how it ended now
        self._forget_cards(entry.id)
        self._auto_budgets.pop(entry.id, None)
        self._unrecorded_ends[entry.id] = (state, reason, self.clock())
        self._record_ends()

    def _record_ends(self) -> None:
        """Record the runs' ends the file has not taken yet (each pass tries again); until then their
        entries stay active in the file, so their nodes stay taken."""
        for id_, (state, reason, at) in list(self._unrecorded_ends.items()):
            try:
                entry = self.store.finish(id_, state, reason, at)
            except QueueWriteError as exc:
                self.trouble.failed(str(exc), "runs' ends are recorded when it can write again; their nodes "
                                              "stay taken until then")
                return
            except QueueError:  # not starting or running any more: nothing to record
                del self._unrecorded_ends[id_]
                continue
            del self._unrecorded_ends[id_]
            self._wrote()
            self._tell(entry, state.value, reason)

    def _stop_run(self, entry: QueueEntry, user: str) -> None:
        """A cancel of a starting or running entry: its run is stopped (TERM, then KILL), and its entry
        ends as cancelled when the run has."""
        self._cancelled_by[entry.id] = user
        run = self._runs.get(entry.id)
        if run is not None:
            run.stop()

    # -- resuming after a restart ----------------------------------------------------------------

    async def _resume(self) -> None:
        """Resume each entry serve left starting or running, once its nodes answer (resume.py)."""
        for entry in [e for e in self.store.unfinished() if e.id in self._unresumed]:
            if await self._resume_one(entry):
                self._unresumed.discard(entry.id)

    async def _resume_one(self, entry: QueueEntry) -> bool:
        """True once `entry` is attached to or finished; False while its nodes do not answer."""
        job = self.spec.jobs.get(entry.job)
        if job is None:
            self._end(entry, EntryState.FAILED, f"job {entry.job} is no longer in {self.spec.source}; its run "
                                                 f"{entry.run_id} is not followed")
            return True
        with contextlib.suppress(QueueError):
            job = apply_overrides(self.spec, job, entry.overrides)
        job = self._where_it_was(entry, job)
        run = JobRun(self.cluster, job, self.experiments, run_id=entry.run_id, pinned=self._pinned.get(entry.id),
                     instance=self._instance(entry))
        try:
            await run.prepare()
            found = await run.nodes.find(running_only=True, run_id=entry.run_id)
        except LaunchError:
            return False
        resume = resume_action(entry, found is not None and found[0] == entry.run_id)
        if resume.action == ATTACH:
            run.adopt(entry.run_id, found[1])
            with contextlib.suppress(LaunchError):
                await run.take_lock()  # the run's own lock, taken over (node_side/scripts/job_lock.py)
            self._follow(self._mark_running(entry), run)
            return True
        await self._resume_ended(entry, run, resume.reason)
        return True

    def _where_it_was(self, entry: QueueEntry, job: JobSpec) -> JobSpec:
        """A run that shared cards, found again after a restart: its GPUs and ports as its run.json says they were,
        so its budget is counted there and a restart of its workers starts them there again."""
        try:
            manifest = read_manifest(self.experiments / entry.run_id)
        except (ReportError, OSError):
            return job
        pinned, port = manifest.get("pinned"), manifest.get("job", {}).get("port")
        if not isinstance(pinned, dict) or not isinstance(port, int):
            return job
        self._pinned[entry.id] = MappingProxyType({str(node): int(gpu) for node, gpu in pinned.items()})
        return self._keep_ports(entry, job, port)

    async def _resume_ended(self, entry: QueueEntry, run: JobRun, reason: str) -> None:
        """A run that is not running any more: its workers' exit statuses say how it ended. Its lock, which
        the stopped serve held, is taken over and released, so the queue's next run of the job need not wait."""
        with contextlib.suppress(LaunchError):
            await run.take_lock()
            await run.release_lock()
        # a starting entry too: its start may have launched every worker, and only "running" not been recorded
        if await run.nodes.ended_state(entry.run_id) is JobState.SUCCEEDED:
            self._end(entry, EntryState.SUCCEEDED, "ended while serve was stopped")
            return
        self._end(entry, EntryState.FAILED, reason)
