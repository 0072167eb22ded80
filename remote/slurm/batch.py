"""One run as one Slurm job: the sbatch command line and the batch script it reads on stdin.

The command is an argv list built from validated config values, never a shell line, and the script is
sent on sbatch's stdin, so nothing needs writing on the login node first. In the script every value is
quoted with shlex, and its one step is srun starting a task on every allocated node at once (`--kill-on-bad-exit`:
one that fails ends the others). The task homegpu gives it holds the node while homegpu's workers run there
(allocation.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.slurm.hostlist import compress
from homegpu.remote.slurm.queue_view import JOB_PREFIX

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SLURM_JOB_ID = re.compile(r"\d+")


@dataclass(frozen=True)
class BatchRequest:
    """What sbatch is asked for one run: the job's Slurm keys and the shape its device plan gives."""

    job: JobSpec
    run_id: str  # launch_plan's new_run_id: JOB-STAMP-HEX
    nodes: int
    nodelist: Sequence[str] = ()  # the nodes the job names (sbatch --nodelist); (): Slurm chooses
    tasks_per_node: int = 1  # tasks per node
    gpus_per_node: int = 0  # from the device plan; the job's own gres wins
    exclusive: bool = False  # whole nodes (sbatch --exclusive): the workers use every GPU of each
    after: Sequence[str] = ()  # Slurm job ids that must succeed first (homegpu submit --after)
    priority: int = 0  # homegpu's: higher starts first; Slurm's nice is its opposite
    output: str = ""  # sbatch --output, a path on the nodes (%j is the job id); "" leaves Slurm's default
    env: Mapping[str, str] = field(default_factory=dict)  # exported by the script before srun

    @property
    def slurm_name(self) -> str:
        return JOB_PREFIX + self.run_id

    @property
    def gres(self) -> str:
        """The job's gres, else one `gpu:N` with the GPUs the plan gives each node (none: no gres)."""
        return self.job.gres or (f"gpu:{self.gpus_per_node}" if self.gpus_per_node else "")

    @property
    def nice(self) -> int:
        """sbatch --nice: lower runs sooner. Only Slurm's operators may go below 0, so a positive priority
        is refused by Slurm for anyone else (refusals.py says so)."""
        return -self.priority


def sbatch_argv(request: BatchRequest) -> list[str]:
    """sbatch's argv for the run; the script goes on its stdin. --parsable makes it print only the id.

    Raises:
        ValueError: a node or task count below one, or an --after that is not a Slurm job id.
    """
    if request.nodes < 1 or request.tasks_per_node < 1:
        raise ValueError(f"a run needs at least one node and one worker per node, not {request.nodes} and "
                         f"{request.tasks_per_node}")
    bad = [job_id for job_id in request.after if not _SLURM_JOB_ID.fullmatch(job_id)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a Slurm job id (a number, as homegpu queue shows it)")
    job = request.job
    argv = ["sbatch", "--parsable", f"--job-name={request.slurm_name}", f"--nodes={request.nodes}",
            f"--ntasks-per-node={request.tasks_per_node}"]
    options = (("--gres", request.gres), ("--partition", job.partition), ("--account", job.account),
               ("--qos", job.qos), ("--time", job.time_limit), ("--output", request.output))
    argv += [f"{option}={value}" for option, value in options if value]
    if request.nodelist:
        argv.append("--nodelist=" + compress(list(request.nodelist)))
    if request.exclusive:
        argv.append("--exclusive")
    if request.after:
        # one that fails makes this one impossible: Slurm cancels it, as homegpu's queue does
        argv += ["--dependency=afterok:" + ":".join(request.after), "--kill-on-invalid-dep=yes"]
    if request.nice:
        argv.append(f"--nice={request.nice}")
    return argv


def batch_script(request: BatchRequest, worker_argv: Sequence[str]) -> str:
    """The script sbatch runs on the first allocated node: the run's environment, then one srun starting
    `worker_argv` as each of the allocation's tasks.

    Raises:
        ValueError: an environment variable whose name a shell cannot export, or no worker command.
    """
    if not worker_argv:
        raise ValueError("the batch script needs the worker's command")
    for name in request.env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a variable name a shell can export")
    exports = {"HOMEGPU_RUN_ID": request.run_id, "HOMEGPU_JOB": request.job.name, **request.env}
    lines = ["#!/bin/sh",
             f"# homegpu run {request.run_id} of job {request.job.name} on {request.nodes} node"
             f"{'s' if request.nodes != 1 else ''}, written by homegpu (remote/slurm/batch.py)",
             "set -eu"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in exports.items()]
    srun = ["srun", "--kill-on-bad-exit=1", f"--ntasks-per-node={request.tasks_per_node}", *worker_argv]
    lines.append("exec " + shlex.join(srun))
    return "\n".join(lines) + "\n"


def submitted_job_id(stdout: str) -> str:
    """The job id sbatch --parsable printed ("12", or "12;cluster" on a federation).

    Raises:
        ValueError: output that is not one.
    """
    first = stdout.strip().split(";")[0]
    if not _SLURM_JOB_ID.fullmatch(first):
        raise ValueError(f"sbatch printed {stdout.strip()[:80]!r}, not a job id")
    return first
