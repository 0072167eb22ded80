"""Slurm's commands on `slurm_login`, over its SSH session: squeue, scancel and sinfo read in homegpu's terms.

Each command goes as an argv (no shell reads a value), and each failure comes back as one SlurmError line that names
the login node and what Slurm said.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator

from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import EventHub
from homegpu.remote.nodes import NODE_GONE, CommandResult, NodeSession, connect_wait
from homegpu.remote.slurm.partitions import Partition, SinfoError, parse_sinfo, sinfo_argv
from homegpu.remote.slurm.queue_view import SlurmJob, SqueueError, parse_squeue, squeue_argv

COMMAND_TIMEOUT = 60.0  # for one of Slurm's commands on the login node (slurmctld may be busy)


class SlurmError(Exception):
    """Slurm refused, ended or forgot a job, or its commands could not be run; one line that says why."""


class SlurmLogin:
    """The login node's session, for Slurm's commands."""

    def __init__(self, session: NodeSession) -> None:
        self.session = session

    @classmethod
    async def reached(cls, session: NodeSession, spec: ClusterSpec) -> SlurmLogin:
        """The login node's session once it is online.

        Raises:
            SlurmError: it is not online within the cluster's connect wait, saying its state and why.
        """
        try:
            await session.wait_online(connect_wait(spec, 5))
        except asyncio.TimeoutError:
            raise SlurmError(f"the Slurm login node {session.name} is {session.state.value}: "
                             f"{session.reason or 'no answer'}; Slurm's commands run there") from None
        return cls(session)

    @property
    def name(self) -> str:
        return self.session.name

    async def queue(self, *job_ids: str) -> list[SlurmJob]:
        """The jobs squeue lists, of any state (only `job_ids` where given; [] once Slurm has forgotten them).

        Raises:
            SlurmError: squeue could not be run or printed something else.
        """
        result = await self.run([*squeue_argv(), *([f"--jobs={','.join(job_ids)}"] if job_ids else [])])
        if not result.ok:
            if job_ids and "Invalid job id" in result.stderr:  # ended longer ago than Slurm's MinJobAge
                return []
            raise SlurmError(f"squeue on {self.name} failed: {result.telling_line}")
        try:
            return parse_squeue(result.stdout)
        except SqueueError as exc:
            raise SlurmError(str(exc)) from None

    async def job(self, job_id: str) -> SlurmJob | None:
        """One job as squeue lists it now; None once Slurm has forgotten it. Raises SlurmError as queue() does."""
        return next(iter(await self.queue(job_id)), None)

    async def cancel(self, job_id: str, signal: str = "") -> None:
        """scancel the job, or with `signal` send it to the job's steps.

        Raises:
            SlurmError: scancel refused (no such job, another user's) or could not be run.
        """
        result = await self.run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])
        if not result.ok:
            raise SlurmError(f"scancel {job_id} on {self.name}: {result.telling_line.removeprefix('scancel: error: ')}")

    async def partitions(self) -> list[Partition]:
        """sinfo's partitions ([] where sinfo cannot say)."""
        with contextlib.suppress(SlurmError, SinfoError):
            result = await self.run(sinfo_argv())
            if result.ok:
                return parse_sinfo(result.stdout)
        return []

    async def run(self, argv: list[str], input: str | None = None) -> CommandResult:
        """Raises SlurmError where the login node cannot be reached."""
        try:
            return await self.session.run(argv, input=input.encode() if input is not None else None,
                                          timeout=COMMAND_TIMEOUT)
        except NODE_GONE as exc:
            raise SlurmError(f"cannot run {argv[0]} on the Slurm login node {self.name}: {exc}") from None


@contextlib.asynccontextmanager
async def slurm_login(spec: ClusterSpec) -> AsyncIterator[SlurmLogin]:
    """The login node of a Slurm cluster, connected on its own (no other node's session), for one command.

    Raises:
        SlurmError: it cannot be reached.
    """
    session = NodeSession(spec, spec.slurm_login_spec(), EventHub(), stream_stats=False)
    session.start()
    try:
        yield await SlurmLogin.reached(session, spec)
    finally:
        await session.close()
