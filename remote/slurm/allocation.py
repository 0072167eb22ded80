"""A run's nodes from Slurm: one Slurm job holds them while homegpu's workers run on them.

On a cluster with `scheduler = "slurm"`, a run first asks `sbatch` on `slurm_login` for as many nodes as the job
needs. The batch script's one step holds each allocated node (HOLD, a task per node that waits) until the run ends
and homegpu releases it, or Slurm ends it (its time limit, `scancel`). Meanwhile homegpu starts, follows, restarts
and stops the workers over SSH on exactly the nodes Slurm allocated, as on any cluster. On a lab whose nodes run
pam_slurm_adopt, those SSH sessions are adopted into the Slurm job, so its limits and accounting cover them.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Callable, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.nodes import wait_set
from homegpu.remote.slurm.batch import BatchRequest, batch_script, sbatch_argv, submitted_job_id
from homegpu.remote.slurm.login import SlurmError, SlurmLogin
from homegpu.remote.slurm.queue_view import SlurmJob, status_words
from homegpu.remote.slurm.refusals import refusal_line

# Each allocated node's task: it holds the node while homegpu's workers do the work there, and ends with the run,
# as the run ended (release()): USR1 exits 0, so the Slurm job COMPLETED and a job submitted --after it starts.
HOLD = ("sh", "-c", "trap 'exit 0' USR1; trap 'exit 1' USR2; sleep infinity & wait")
POLL_SECONDS = 2.0
_ENDED = ("succeeded", "failed", "cancelled")


class SlurmAllocation:
    """The Slurm job that holds one run's nodes. submit() and wait_running(), or take one that runs (job_id);
    release() or cancel() at the end."""

    def __init__(self, login: SlurmLogin, job: JobSpec, run_id: str, job_id: str = "") -> None:
        self.login, self.job, self.run_id = login, job, run_id
        self.job_id = job_id  # Slurm's, once submitted

    async def submit(self, nodes: int, nodelist: Sequence[str] = (), gpus_per_node: int = 0, priority: int = 0,
                     after: Sequence[str] = ()) -> str:
        """Ask sbatch for the nodes; Slurm's job id.

        Raises:
            SlurmError: sbatch refused (one line naming the job's key and the fix), or could not be run.
        """
        # without a gres the workers take every GPU a node has (the device plan's default): the node is the run's
        request = BatchRequest(self.job, self.run_id, nodes=nodes, nodelist=tuple(nodelist),
                               gpus_per_node=gpus_per_node, exclusive=not (self.job.gres or gpus_per_node),
                               priority=priority, after=tuple(after), output="/dev/null")
        result = await self.login.run(sbatch_argv(request), input=batch_script(request, HOLD))
        if not result.ok:
            raise SlurmError(refusal_line(request, result.stderr, await self.login.partitions()))
        try:
            self.job_id = submitted_job_id(result.stdout)
        except ValueError as exc:
            raise SlurmError(f"{self.login.name}: {exc}") from None
        return self.job_id

    async def wait_running(self, say: Callable[[str], None], stop: asyncio.Event) -> list[str]:
        """Wait until Slurm runs the job, saying each new reason it waits; the nodes it allocated.

        Raises:
            SlurmError: the job ended before it ran (cancelled, a dependency that failed), or `stop` was set.
        """
        said = ""
        while True:
            job = await self.login.job(self.job_id)
            if job is None or job.homegpu_state in _ENDED:
                raise SlurmError(f"Slurm job {self.job_id} ended before it ran: {_how(job)}")
            if job.homegpu_state == "running" and job.nodes():
                return job.nodes()
            words = f"Slurm job {self.job_id}: {status_words(job)}"
            if words != said:
                say(words)
                said = words
            if await wait_set(stop, POLL_SECONDS):
                raise SlurmError(f"stopped while Slurm job {self.job_id} waited")

    async def ended(self) -> str:
        """Why Slurm ended the job while the run went on ("" while it runs, or when squeue cannot be asked)."""
        try:
            job = await self.login.job(self.job_id)
        except SlurmError:
            return ""  # the login node away is no reason to stop the workers
        if job is not None and job.homegpu_state not in _ENDED:
            return ""
        return f"Slurm ended job {self.job_id}, which held the run's nodes: {_how(job)}"

    async def release(self, succeeded: bool) -> None:
        """End the job as the run ended: COMPLETED for a run that succeeded, FAILED otherwise (HOLD's signals).
        Where the signal cannot be sent, the job is cancelled."""
        if self.job_id:
            with contextlib.suppress(SlurmError):
                await self.login.cancel(self.job_id, signal="USR1" if succeeded else "USR2")
                self.job_id = ""
        await self.cancel()

    async def cancel(self) -> None:
        """scancel the job (once; nothing when it was never submitted). A failure is left to Slurm's time limit."""
        job_id, self.job_id = self.job_id, ""
        if job_id:
            with contextlib.suppress(SlurmError):
                await self.login.cancel(job_id)


def _how(job: SlurmJob | None) -> str:
    return status_words(job) if job else "squeue no longer lists it"


def running_run(jobs: list[SlurmJob], job: str) -> SlurmJob | None:
    """The newest homegpu Slurm job of `job` that runs now (another controller's run, to attach to)."""
    live = [slurm_job for slurm_job in jobs if slurm_job.job == job and slurm_job.homegpu_state == "running"]
    return live[-1] if live else None
