"""homegpu.remote.jobs: a run's life across its nodes: preflight, code sync, launch-or-attach under the
job's lock, the watch loop and its restarts, the workers' logs, script errors, the outputs home.
"""

from __future__ import annotations

from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError, list_workers
from homegpu.remote.jobs.run import JobRun, RunOutcome
from homegpu.remote.jobs.script_check import keras3_problem

__all__ = [
    "JobRuntimes", "JobRun", "LaunchError", "RunOutcome",
    "keras3_problem", "list_workers",
]
