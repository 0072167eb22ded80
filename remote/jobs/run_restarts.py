"""A run's failures judged and its restarts: a full disk, a script error or the same error ending two generations in a
row ends it (restarting cannot fix them), anything else restarts every worker with the next generation, with backoff,
while restarts are left, waiting for a node that is away first and going on without one that does not come back."""

from __future__ import annotations

import time

from homegpu.remote.events import JobState
from homegpu.remote.jobs.disk import full_disks
from homegpu.remote.jobs.failure import Verdict, judge, might_be_script_error, ran_out_of_memory, repeatable_errors
from homegpu.remote.jobs.fewer import FewerWorkersRefused
from homegpu.remote.jobs.run_generation import Generations
from homegpu.remote.jobs.run_members import Members
from homegpu.remote.jobs.run_state import POLL_SECONDS, RunState
from homegpu.remote.jobs.watch import retry_is_pointless, worker_ends
from homegpu.remote.jobs.worker_logs import finish_tails

MAX_BACKOFF_SECONDS = 30.0
SCRIPT_ERROR_WAIT = 10.0  # for the other workers to fail by themselves too (a script error fails them all)


class Restarts:
    """What the run's controller does when a worker failed or stalled."""

    def __init__(self, run: RunState, generations: Generations, members: Members) -> None:
        self.run, self.generations, self.members = run, generations, members
        self._errors: tuple[int, dict[tuple, str]] = (0, {})  # the last failed generation's (repeatable_errors)

    async def restart(self, failure: str) -> str | None:
        """Restart every worker with the next generation, with backoff, while restarts are left.

        A node that is away (rebooting, cut off) is waited for first, up to the job's
        reconnect_timeout, without using up a restart; a restart whose start fails still uses one.
        Returns None once the workers run again, else why the run failed for good.
        """
        run = self.run
        if full := await full_disks(run.tracks.values(), run.run_id):
            await self.generations.stop_workers()
            return "; ".join(full)  # a restart would fill it again
        verdict = await self._judge_failure()
        if verdict is not None and verdict.script_error:
            await self.generations.stop_workers()
            return verdict.summary
        if repeated := await self._repeated():
            await self.generations.stop_workers()
            return repeated
        self._even_after_out_of_memory()
        while True:
            if run.job.restart != "on-failure" or run.restarts >= run.job.max_restarts \
                    or retry_is_pointless(run.job, run.tracks.values()):
                await self.generations.stop_workers()
                return failure
            run.restarts += 1
            run.publish(JobState.RESTARTING, failure)
            await self.generations.end()
            await run.sleep(min(2.0 ** (run.restarts - 1), MAX_BACKOFF_SECONDS))
            if gone := await self._wait_for_nodes():
                try:
                    await self.members.go_on_without(gone)
                except FewerWorkersRefused as exc:
                    return f"restart failed: {exc}"
            elif (back := self.members.returned()) and (problem := await self.members.take_back(back)):
                run.publish(JobState.RESTARTING, problem)
            if run.stop_requested.is_set():
                return None  # watch() stops what is left
            if (problem := await self.generations.start_next()) is None:
                return None
            failure = f"restart failed: {problem}"

    def _even_after_out_of_memory(self) -> None:
        """A generation that ran out of GPU memory at balanced shares is followed by one from the even split, which
        fitted before the shares moved: started at the same shares it would only run out again. Its first steps
        measure each GPU's memory, which then caps its share (trainer/memory_cap.py)."""
        run = self.run
        shares = run.first_shares()
        if shares and len(set(shares)) > 1 and ran_out_of_memory(worker_ends(run.tracks.values())):
            run.even_generation = run.generation + 1
            run.publish(JobState.RESTARTING, f"out of GPU memory at the shares {'/'.join(map(str, shares))}: the next "
                                   "generation starts from the even split, and each GPU's memory then caps its share")

    async def _judge_failure(self) -> Verdict | None:
        """A script error (every worker failed by itself before any progress, with the same error) is
        not a fault: restarting cannot fix it. The other workers get SCRIPT_ERROR_WAIT seconds to end
        by themselves first, since stopping them would hide their own error. None: a fault."""
        run = self.run
        if not any(might_be_script_error(end) for end in worker_ends(run.tracks.values())):
            return None
        deadline = time.monotonic() + SCRIPT_ERROR_WAIT
        while time.monotonic() < deadline and not all(t.ended for t in run.tracks.values()):
            await run.sleep(POLL_SECONDS)
            await run.watch.poll(run.run_id, run.generation)
        await finish_tails(run.tracks.values(), run.run_id)  # every worker's own last lines, to compare errors
        return judge(worker_ends(run.tracks.values()))

    async def _repeated(self) -> str | None:
        """The line ending the run when this generation failed with an error the last one failed with too (the
        same worker, exception type and place in the user's code): a restart would meet it again."""
        run = self.run
        await finish_tails(run.tracks.values(), run.run_id)  # each failed worker's traceback, to its end
        errors = repeatable_errors(worker_ends(run.tracks.values()))
        (before, last), self._errors = self._errors, (run.generation, errors)
        same = [words for key, words in errors.items() if key in last]
        if not same:
            return None
        return (f"the same error ended generations {before} and {run.generation}: {same[0]}; not "
                "restarted again, since every generation would meet it: fix the script and run again")

    async def _wait_for_nodes(self) -> str:
        """Before a restart, wait for the job's nodes that are away, saying so; why they did not come back."""
        run = self.run
        if away := run.nodes.away():
            run.publish(JobState.RESTARTING, f"waiting up to {run.job.reconnect_timeout:g} s for "
                        f"{', '.join(node.name for node in away)} to come back ({away[0].state.value})")
        return await run.nodes.wait_back(run.job.reconnect_timeout, run.stop_requested)
