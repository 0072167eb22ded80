"""Following a run another controller leads: attached to it (adopt), its failures are that controller's to act on;
this one follows the next generation it starts or the end it makes, and takes the run over once its lock goes
stale."""

from __future__ import annotations

import contextlib

from homegpu.remote.events import JobState
from homegpu.remote.jobs.job_runtimes import LaunchError
from homegpu.remote.jobs.lock import STALE_AFTER_SECONDS, RunLockError
from homegpu.remote.jobs.lock import holder as lock_holder
from homegpu.remote.jobs.run_backups import RunBackups
from homegpu.remote.jobs.run_generation import Generations
from homegpu.remote.jobs.run_state import RunState
from homegpu.remote.jobs.worker_logs import finish_tails
from homegpu.remote.nodes import NODE_GONE
from homegpu.remote.record import ExperimentLog

FOLLOW_SECONDS = 2.0  # how often a controller that attached looks for what the run's own controller did
GONE, STALE, HEARD = "gone", "stale", "heard"  # the run's own controller, as its lock says (_its_controller)


class Following:
    """Attach to a run and follow the controller that leads it."""

    def __init__(self, run: RunState, generations: Generations, backups: RunBackups) -> None:
        self.run, self.generations, self.backups = run, generations, backups

    def adopt(self, run_id: str, generation: int, at_once: int = 1) -> None:
        """Take over a run started by another homegpu process: follow it, never start it twice. `at_once`: how
        many runs of the job run now, this the newest (the others are named by `homegpu queue`)."""
        run = self.run
        run.run_id, run.generation, run.adopted = run_id, generation, True
        run.experiment = ExperimentLog(run.experiments_root, run_id)
        self.backups.keep_copies()
        run.start_record()
        self.generations.follow_logs({label: run.experiment.recorded_lines(label, generation) for label in run.tracks})
        run.publish(JobState.RUNNING, "attached to a running job" + (
            f" (the newest of {at_once} runs of {run.job.name} at once: `homegpu queue` lists them)" if at_once > 1
            else ""))

    async def follow_its_controller(self, failure: str) -> tuple[JobState, str] | None:
        """A run this controller attached to failed: the controller that started it (the run lock's holder) restarts
        or regroups it, not this one too (two would start every worker twice). Follow what it does: the run's next
        generation once it runs, or its end once it releases the lock. None: go on watching (a next generation is
        followed, or the holder's lock went stale and this controller took the run over)."""
        run = self.run
        run.publish(JobState.RESTARTING, f"{failure}; the controller that started the run acts on it: following")
        while not run.stop_requested.is_set():
            controller = await self._its_controller()
            if controller == GONE:
                state = await run.nodes.ended_state(run.run_id)
                return state, ("every worker succeeded" if state is JobState.SUCCEEDED else
                               f"ended by the controller that started it, after: {failure}")
            found = await run.nodes.find()
            if found is not None and found[0] == run.run_id and found[1] > run.generation:
                await self._follow_generation(found[1])
                return None
            if controller == STALE and await self._take_over():
                return None
            await run.sleep(FOLLOW_SECONDS)
        return None  # watch() stops the workers

    async def _its_controller(self) -> str:
        """The run's lock as the chief's node has it: GONE (released, or another run's), STALE (no heartbeat for
        STALE_AFTER_SECONDS), else HEARD (or not readable: the chief's node away; its next generation tells)."""
        run = self.run
        chief = run.slots[0].node.name
        try:
            holder = await lock_holder(run.cluster.node(chief), run.nodes.work_dirs[chief], run.instance)
        except (RunLockError, *NODE_GONE):
            return HEARD
        if holder is None or holder.run_id != run.run_id:
            return GONE
        return STALE if holder.age is not None and holder.age >= STALE_AFTER_SECONDS else HEARD

    async def _take_over(self) -> bool:
        """Take the run's lock from a controller gone quiet; whether this controller now leads the run."""
        with contextlib.suppress(LaunchError):
            if await self.run.take_lock() is None:
                self.run.publish(JobState.RESTARTING, "the controller that started the run went quiet: taking it over")
                return True
        return False

    async def _follow_generation(self, generation: int) -> None:
        """Follow the generation the run's controller started, as it would itself (its logs, its workers)."""
        run = self.run
        await finish_tails(run.tracks.values(), run.run_id)
        run.restarts += 1
        self.generations.begin(generation)
        self.generations.follow_logs()
        run.publish(JobState.RUNNING, f"following generation {generation}, started by the run's controller")
