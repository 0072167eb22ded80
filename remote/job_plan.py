"""Pure planning for a run: run ids, each worker's command line, and what an exit status means."""

from __future__ import annotations

import posixpath
import secrets
import signal
import time
from pathlib import PurePosixPath

from homegpu.remote.job_config import JobSpec
from homegpu.remote.process_owners import MARKER_INDEX, MARKER_JOB, MARKER_RUN
from homegpu.remote.runtime import NodePaths

TRAINER_PACKAGE_DIR = "_homegpu"  # under the synced code root: holds homegpu/trainer for PYTHONPATH


def new_run_id(job: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job}-{stamp}-{secrets.token_hex(2)}"


def worker_argv(job: JobSpec, paths: NodePaths, script_rel: str = "") -> tuple[str, ...]:
    """The worker's command: the built-in trainer, or the user's script (`script_rel`, relative
    to the synced code dir) with its args. Workers run in their output dir (see worker_cwd)."""
    if job.uses_trainer:
        argv = [paths.python, "-m", "homegpu.trainer", "--data", _data_arg(job.data, paths),
                "--model", job.model, "--epochs", str(job.epochs), "--batch-size", str(job.batch_size),
                "--output", paths.output_dir]
        if job.steps_per_epoch:
            argv += ["--steps-per-epoch", str(job.steps_per_epoch)]
        return tuple(argv)
    return (paths.python, posixpath.join(paths.code_dir, script_rel or PurePosixPath(job.script).name), *job.args)


def worker_cwd(paths: NodePaths) -> str:
    """The output dir: writable on every runtime (the code is mounted read-only in containers, and
    the next sync would delete files written next to it), so a script's relative writes land there."""
    return paths.output_dir


def _data_arg(data: str, paths: NodePaths) -> str:
    """`npz:`/`dir:` paths are relative to the job's data_dir when it is mounted (Docker: /data)."""
    kind, _, where = data.partition(":")
    if not where or posixpath.isabs(where) or not paths.data_dir:
        return data
    return f"{kind}:{posixpath.join(paths.data_dir, where)}"


def worker_env(job: JobSpec, paths: NodePaths) -> dict[str, str]:
    """Environment for a worker: the job's env, the shipped trainer on PYTHONPATH, legacy Keras."""
    env = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1", "HOMEGPU_OUTPUT_DIR": paths.output_dir,
           **job.env}
    if job.uses_trainer:
        env["PYTHONPATH"] = posixpath.join(paths.code_dir, TRAINER_PACKAGE_DIR)
    return env


def worker_markers(job: str, run_id: str, index: int) -> dict[str, str]:
    """Environment that marks a worker's processes as this run's, for whoever looks at the node's
    GPU processes (the stats agent, through remote/process_owners.py); children inherit it."""
    return {MARKER_JOB: job, MARKER_RUN: run_id, MARKER_INDEX: str(index)}


def classify_exit(status: int | None) -> str:
    """A few words on why a worker ended, for events and the run summary."""
    if status is None:
        return "vanished (killed with its supervisor, or the node rebooted)"
    if status == 0:
        return "succeeded"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return {"SIGKILL": "killed (SIGKILL: out of memory, or stopped by force)",
                "SIGTERM": "terminated (SIGTERM)"}.get(name, f"killed by {name}")
    if status == 143:
        return "terminated (exit 143: SIGTERM)"
    if status == 137:
        return "killed (exit 137: SIGKILL inside a container, often out of memory)"
    if status in (126, 127):
        return f"could not run its command (exit {status}: not found or not executable)"
    return f"failed (exit {status})"
