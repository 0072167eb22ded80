"""Planning for a run, with no node involved: run ids, where the job's code is here, each worker's launch
(command line, environment, TF_CONFIG, devices), and what an exit status means."""

from __future__ import annotations

import posixpath
import secrets
import signal
import time
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Sequence

from homegpu.remote.config import EMBEDDED_DEFAULT, JobSpec
from homegpu.remote.jobs.backup_copy import BACKUP_DIR
from homegpu.remote.node_side import MARKER_INDEX, MARKER_JOB, MARKER_RUN
from homegpu.remote.plan import (
    JAX_DEMO_MODULE, TORCH_DEMO_MODULE, DevicePlan, WorkerSlot, docker_device_ids, jax_env, tf_config_json,
    torchrun_argv,
)
from homegpu.remote.runtimes import NodePaths, Runtime, WorkerLaunch

TRAINER_PACKAGE_DIR = "_homegpu"  # under the synced code root: holds homegpu/trainer for PYTHONPATH
USER_SCRIPT_MODULE = "homegpu.trainer.user_script"  # starts a user's script (trainer/user_script.py)


def new_run_id(job: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{job}-{stamp}-{secrets.token_hex(2)}"


def worker_argv(job: JobSpec, paths: NodePaths, script_rel: str = "") -> tuple[str, ...]:
    """The worker's command: the built-in trainer, or the user's script (`script_rel`, relative
    to the synced code dir) with its args, started through trainer/user_script.py (which runs it
    as `python SCRIPT ARGS` would), or the built-in JAX demo. Workers run in their output dir (see worker_cwd)."""
    if job.uses_trainer and job.is_jax:
        return (paths.python, *_demo_program(JAX_DEMO_MODULE, job, paths))
    if job.uses_trainer:
        argv = [paths.python, "-m", "homegpu.trainer", "--data", _data_arg(job.data, paths),
                "--model", job.model, "--epochs", str(job.epochs), "--batch-size", str(job.batch_size),
                "--output", paths.output_dir]
        if job.steps_per_epoch:
            argv += ["--steps-per-epoch", str(job.steps_per_epoch)]
        return tuple(argv)
    return (paths.python, "-m", USER_SCRIPT_MODULE, _script_path(job, paths, script_rel), *job.args)


def torch_program(job: JobSpec, paths: NodePaths, script_rel: str) -> list[str]:
    """What torchrun starts in each process: the job's script and args, or the built-in PyTorch demo."""
    if not job.uses_trainer:
        return [_script_path(job, paths, script_rel), *job.args]
    return [*_demo_program(TORCH_DEMO_MODULE, job, paths), "--model", job.model]


def _demo_program(module: str, job: JobSpec, paths: NodePaths) -> list[str]:
    """`-m MODULE` with the job's schedule: the PyTorch or the JAX demo."""
    program = ["-m", module, "--epochs", str(job.epochs), "--batch-size", str(job.batch_size),
               "--output", paths.output_dir]
    return program + (["--steps-per-epoch", str(job.steps_per_epoch)] if job.steps_per_epoch else [])


def _script_path(job: JobSpec, paths: NodePaths, script_rel: str) -> str:
    """The job's script on the node, in its synced code dir."""
    return posixpath.join(paths.code_dir, script_rel or PurePosixPath(job.script).name)


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
    """Environment for a worker: the job's env, the shipped trainer package first on PYTHONPATH (a
    user's script gets the job's PYTHONPATH back from user_script.py), legacy Keras (`tf.keras` is
    tf-keras) or, in a JAX job, Keras 3 on JAX, the job's `keras` choice for a script's own `import keras`,
    and where a script's BackupAndRestore keeps what homegpu copies off the chief (jobs/backup_copy.py)."""
    keras = {"KERAS_BACKEND": "jax"} if job.is_jax else {"TF_USE_LEGACY_KERAS": "1"}
    env = {**keras, "PYTHONUNBUFFERED": "1", "HOMEGPU_OUTPUT_DIR": paths.output_dir,
           "HOMEGPU_BACKUP_DIR": posixpath.join(paths.output_dir, BACKUP_DIR), "HOMEGPU_BALANCE": job.balance,
           **job.env}
    shipped = posixpath.join(paths.code_dir, TRAINER_PACKAGE_DIR)
    env["PYTHONPATH"] = shipped if job.uses_trainer else ":".join(filter(None, (shipped, job.env.get("PYTHONPATH"))))
    if not job.uses_trainer and job.keras == "tf-keras":
        env["HOMEGPU_KERAS"] = "tf-keras"
    return env


def worker_markers(job: str, run_id: str, index: int) -> dict[str, str]:
    """Environment that marks a worker's processes as this run's, for whoever looks at the node's
    GPU processes (the stats agent, through remote/node_side/agent/process_owners.py); children inherit it."""
    return {MARKER_JOB: job, MARKER_RUN: run_id, MARKER_INDEX: str(index)}


def local_code(job: JobSpec, config_source: str) -> Path:
    """The job's code on this machine: the built-in trainer's package, else its code_dir (or its
    script's folder), relative to the cluster file's folder (`config_source`'s)."""
    if job.uses_trainer:
        return trainer_package()
    return (_config_dir(config_source) / (job.code_dir or Path(job.script).parent)).expanduser().resolve()


def trainer_package() -> Path:
    """homegpu/trainer on this machine: shipped to every node for the built-in trainer and user scripts."""
    return Path(str(resources.files("homegpu.trainer")))


def script_rel(job: JobSpec, config_source: str) -> str:
    """The job's script relative to its local code ("" for the built-in trainer)."""
    if job.uses_trainer:
        return ""
    script = (_config_dir(config_source) / job.script).expanduser().resolve()
    return script.relative_to(local_code(job, config_source)).as_posix()


def _config_dir(config_source: str) -> Path:
    """Where the job's relative paths start: the cluster file's folder (the embedded default: here)."""
    return Path.cwd() if config_source == EMBEDDED_DEFAULT else Path(config_source).parent


def worker_launch(job: JobSpec, run_id: str, generation: int, slots: Sequence[WorkerSlot], slot: WorkerSlot,
                  runtime: Runtime, code_dir: str, plan: DevicePlan | None, script: str,
                  shares: Sequence[int] | None = None) -> WorkerLaunch:
    """How `runtime` starts `slot`'s worker: `code_dir` is the job's synced code on its node,
    `script` the script relative to it (script_rel), `plan` every worker's devices (None: all), `shares` the
    first shares of a step a balanced run starts with (the run's or its job's last: trainer/shares.py)."""
    paths = runtime.worker_paths(run_id, slot.label, code_dir, job.data_dir, job.python)
    devices = plan.workers[slot.index] if plan else None
    env = worker_env(job, paths)
    if shares and job.balance == "speed":
        env["HOMEGPU_SHARES"] = ",".join(map(str, shares))
    if devices is not None:  # the job's own env may still override what the plan sets
        env = {**runtime.device_env(plan, devices), **env}
    if job.is_jax:
        env.update(jax_env(slots, slot))
    env.update(worker_markers(job.name, run_id, slot.index))  # not the job's to override
    if job.is_pytorch:
        processes = devices.replicas if devices is not None else 1
        argv = torchrun_argv(paths.python, slots, slot, processes, torch_program(job, paths, script))
    else:
        argv = worker_argv(job, paths, script)
    return WorkerLaunch(
        job=job.name, run_id=run_id, generation=generation, slot=slot,
        tf_config=tf_config_json(slots, slot.index) if job.is_tensorflow else "",
        argv=argv, cwd=worker_cwd(paths), python=paths.python,
        code_dir=code_dir, output_dir=runtime.out_dir(run_id, slot.label),
        env=env, image=job.image, data_dir=job.data_dir,
        device_ids=tuple(docker_device_ids(devices)) if devices else None,
    )


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
