"""homegpu.remote.slurm: a lab's Slurm as the scheduler of a cluster's runs: a run's sbatch command and batch
script, Slurm's hostlists, its queue and pending reasons in homegpu's words, its partitions, sbatch's refusals as
one line naming the job and the fix, and the allocation that holds a run's nodes (allocation.py).

Only login.py and allocation.py run commands (on `slurm_login`, over its SSH session); each other module builds an argv or
reads one's output (the formats are fixed here, and tests/fixtures/slurm/ holds what a real Slurm printed for them).
"""

from __future__ import annotations

from homegpu.remote.slurm.allocation import SlurmAllocation, running_run
from homegpu.remote.slurm.batch import BatchRequest, batch_script, sbatch_argv, submitted_job_id
from homegpu.remote.slurm.hostlist import HostlistError, compress, expand
from homegpu.remote.slurm.login import SlurmError, SlurmLogin, slurm_login
from homegpu.remote.slurm.partitions import Partition, SinfoError, parse_sinfo, sinfo_argv
from homegpu.remote.slurm.queue_view import (
    SlurmJob, SqueueError, homegpu_jobs, parse_squeue, squeue_argv, status_words, waiting_words,
)
from homegpu.remote.slurm.refusals import refusal_line, slurms_words

__all__ = [
    "BatchRequest", "HostlistError", "Partition", "SinfoError", "SlurmAllocation", "SlurmError", "SlurmJob", "SlurmLogin", "slurm_login",
    "SqueueError", "running_run", "batch_script", "compress",
    "expand", "homegpu_jobs", "parse_sinfo", "parse_squeue", "refusal_line", "sbatch_argv", "sinfo_argv",
    "slurms_words", "squeue_argv", "status_words", "submitted_job_id", "waiting_words",
]
