"""`[jobs.NAME]` tables: what to train, where, and how to recover, as frozen JobSpecs.

Validated with checks.py's Validator, like the rest of cluster.toml, so a mistake here gives the
same one-line, located error.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from homegpu.remote.config.checks import MAX_PORT, NAME_RE, Check, Limits, Validator, show, type_name
from homegpu.remote.config.durations import Duration
from homegpu.remote.config.key_tables import JOBS
from homegpu.remote.config.node_spec import NodeSpec
from homegpu.remote.config.sizes import EXAMPLES as SIZE_EXAMPLES
from homegpu.remote.config.sizes import size_bytes, size_text
from homegpu.remote.config.slurm_keys import HOMEGPU, parse_slurm_job
from homegpu.remote.config.toml_lines import LineIndex
from homegpu.trainer import MODELS, TORCH_DEMO_MODELS

DEFAULT_IMAGE = "homegpu/tensorflow:2.21"
# A job's image when it names none, by framework: what `homegpu image build --framework F` builds.
DEFAULT_IMAGES = {"tensorflow": DEFAULT_IMAGE, "pytorch": "homegpu/pytorch:2.14", "jax": "homegpu/jax:0.10"}
DEFAULT_JOB_PORT = 23456
RESTART_POLICIES = ("never", "on-failure")
KEEP_GLOBAL_BATCH, KEEP_WORKER_BATCH = "keep-global-batch", "keep-worker-batch"  # on_fewer_workers (jobs/fewer.py)
# Keys that apply only to some jobs, left out of the settings a run records (JobSpec.settings).
TRAINER_SCHEDULE_KEYS = frozenset({"epochs", "batch_size", "steps_per_epoch"})  # the built-in trainers
TENSORFLOW_TRAINER_KEYS = frozenset({"data", "model", "on_fewer_workers"})
TENSORFLOW_LAYOUT_KEYS = frozenset({"workers_per_node", "share_gpus"})  # torchrun starts a process per GPU itself
FRAMEWORKS = ("tensorflow", "pytorch", "jax")  # pytorch: under torchrun, one per node; jax: jax.distributed
FRAMEWORK_NAMES = {"tensorflow": "TensorFlow", "pytorch": "PyTorch", "jax": "JAX"}  # as people write them
KERAS_CHOICES = ("keras", "tf-keras")  # what a script's `import keras` gives: the python's own keras, or tf-keras
BALANCE_CHOICES = ("speed", "even")  # each worker's share of a step: by its measured speed, or the same for all

# (lowest, highest, unit) of each number: far beyond what a real job needs, so that only a typo (or a
# fuzzer) meets them, and nothing downstream sees NaN, infinity or a thousand-digit integer.
LIMITS: Limits = {
    "workers_per_node": (1, 64, " workers"),
    "epochs": (1, 1_000_000, ""),
    "batch_size": (1, 1_048_576, ""),
    "steps_per_epoch": (0, 1_000_000_000, ""),
    "max_restarts": (0, 1000, ""),
    "stall_timeout": (1.0, 604_800.0, " seconds (a week)"),
    "reconnect_timeout": (1.0, 604_800.0, " seconds (a week)"),
    "min_workers": (1, 1024, " workers"),
}

_IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?")
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DATA_RE = re.compile(r"synthetic|(npz|dir):.+")

TRAINER_KEYS = ("epochs", "batch_size", "steps_per_epoch", "data", "model")  # the built-in trainer's alone
PER_GPU = "per-gpu"  # workers_per_node: one worker per GPU of each node (one on a node without GPUs)
MAX_GPUS_PER_NODE = 16  # the ports a "per-gpu" job may need on one node
AUTO = "auto"  # gpu_memory: the peak its job's last run held on a GPU
GPU_MEMORY_RANGE = (64 * 1024 ** 2, 1024 ** 4)  # 64 MiB to 1 TiB: beyond any card, and within any budget
MAX_SCRIPT_BYTES = 2 << 20  # a script read for its imports (framework unset); larger: no training script


@dataclass(frozen=True)
class JobSpec:
    """One training job. With no `script` it runs the built-in trainer (`data`, `model`)."""

    name: str
    image: str = DEFAULT_IMAGE
    python: str = ""
    script: str = ""
    code_dir: str = ""
    args: tuple[str, ...] = ()
    data: str = "synthetic"
    model: str = ""  # "": the framework's default (the trainer's "cnn", the PyTorch demo's "mlp")
    data_dir: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    nodes: tuple[str, ...] = ()
    workers_per_node: int | str = 1  # or PER_GPU
    share_gpus: bool = False  # let two workers of a node use the same GPU
    port: int = DEFAULT_JOB_PORT
    epochs: int = 2
    batch_size: int = 64
    steps_per_epoch: int = 0
    restart: str = "on-failure"
    max_restarts: int = 3
    stall_timeout: float = 300.0
    reconnect_timeout: float = 300.0  # how long a restart waits for a node that is away (rebooting)
    keras: str = "keras"  # "tf-keras": a script's `import keras` gets tf-keras (Keras 3 cannot train under MWMS)
    framework: str = "tensorflow"  # or "pytorch": torchrun on each node, a process per GPU; or "jax"
    min_workers: int = 0  # how few workers a run goes on with when machines leave for good (0: every one)
    on_fewer_workers: str = KEEP_GLOBAL_BATCH  # or KEEP_WORKER_BATCH: the built-in trainer's batch then
    rejoin: bool = True  # a lost node back rejoins at the end of an epoch (False: at the next restart only)
    # what a script's chief wrote in its working dir that every worker resumes from (jobs/checkpoint_copy.py); "": all
    checkpoint: str = ""
    balance: str = "speed"  # each worker's share of a step by its measured speed (trainer/shares.py), or "even"
    # bytes of GPU memory each of its processes may hold on its card (0: the whole card), or AUTO
    gpu_memory: int | str = 0
    # sbatch's options on a Slurm cluster (slurm_keys.py), "" where Slurm's default applies
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""  # as Slurm prints a limit: "30:00", "2:00:00", "1-00:00:00"
    gres: str = ""  # per node, e.g. "gpu:rtx4090:2"; "": the GPUs the device plan gives each node

    def __post_init__(self) -> None:
        if not self.model:  # a JobSpec made in code gets its framework's default model, as a parsed one does
            object.__setattr__(self, "model", _models(self.framework)[0])

    @property
    def is_pytorch(self) -> bool:
        return self.framework == "pytorch"

    @property
    def is_tensorflow(self) -> bool:
        return self.framework == "tensorflow"

    @property
    def is_jax(self) -> bool:
        return self.framework == "jax"

    @property
    def uses_trainer(self) -> bool:
        return not self.script

    @property
    def most_workers_per_node(self) -> int:
        """The most workers one node may run (the ports it needs from `port` on)."""
        return MAX_GPUS_PER_NODE if self.workers_per_node == PER_GPU else int(self.workers_per_node)

    def python_for(self, node: NodeSpec) -> str:
        return self.python or node.python

    def settings(self) -> dict:
        """The keys that apply to this job, with their values, as its run records them (run.json, the
        report): a script leaves out the built-in trainer's schedule and model, a PyTorch job
        TensorFlow's worker layout, and only a TensorFlow script keeps `keras`."""
        tensorflow_trainer = self.uses_trainer and self.is_tensorflow
        unused = ((frozenset() if self.uses_trainer else TRAINER_SCHEDULE_KEYS)
                  | (frozenset() if tensorflow_trainer else TENSORFLOW_TRAINER_KEYS)
                  | (TENSORFLOW_LAYOUT_KEYS if self.is_pytorch else frozenset())
                  | (frozenset() if self.script and self.is_tensorflow else {"keras"})
                  | (frozenset({"checkpoint"}) if self.uses_trainer else frozenset()))
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in unused}


def parse_jobs(v: Validator, data: dict, node_names: tuple[str, ...],
               scheduler: str = HOMEGPU) -> Mapping[str, JobSpec]:
    """Every `[jobs.NAME]` table of the parsed file, validated for the cluster's `scheduler`. Raises ConfigError."""
    raw = v.table(data, ("jobs",))
    jobs = {}
    for name, table in raw.items():
        if not isinstance(table, dict):
            raise v.fail(("jobs", name), "must be a table", f"write it as a [jobs.{name}] table")
        if not NAME_RE.fullmatch(name):
            raise v.fail(("jobs", name), f"invalid job name {show(name)}", "use up to 64 letters, digits, - _ .")
        jobs[name] = parse_job(v, name, table, node_names, scheduler)
    return MappingProxyType(jobs)


def parse_job(v: Validator, name: str, table: dict, node_names: tuple[str, ...], scheduler: str = HOMEGPU) -> JobSpec:
    """Validate one [jobs.NAME] table (its Slurm keys only on a Slurm cluster). Raises ConfigError."""
    path = ("jobs", name)
    v.unknown_keys(table, path, JOBS.names, JOBS.hint)
    get = v.getter(table, path, LIMITS)

    def check_nodes(key_path: tuple, value: list) -> None:
        for item in value:
            if item not in node_names:
                listed = ", ".join(node_names[:8]) + (", ..." if len(node_names) > 8 else "")
                raise v.fail(key_path, f"unknown node {show(item)}", f"use names from [[nodes]]: {listed}")
        if len(set(value)) != len(value):
            raise v.fail(key_path, "a node is listed twice", "list each node once")
        if not value:
            raise v.fail(key_path, "the node list is empty", "leave nodes out to use every node")

    framework = get("framework", str, _script_framework(v.file, table.get("script"), table.get("env")),
                    v.choice(FRAMEWORKS))
    job = JobSpec(
        name=name,
        image=get("image", str, DEFAULT_IMAGES[framework], _check_image(v)),
        python=get("python", str, "", v.check_path),
        script=get("script", str, "", v.check_path),
        code_dir=get("code_dir", str, "", v.check_path),
        args=tuple(get("args", list, [], _check_strings(v))),
        data=get("data", str, "synthetic", _check_data(v)),
        model=get("model", str, _models(framework)[0], v.choice(_models(framework))),
        data_dir=get("data_dir", str, "", v.check_path),
        env=MappingProxyType(get("env", dict, {}, _check_env(v))),
        nodes=tuple(get("nodes", list, [], check_nodes)),
        workers_per_node=_workers_per_node(v, table, path),
        share_gpus=get("share_gpus", bool, False),
        port=get("port", int, DEFAULT_JOB_PORT, v.check_port),
        epochs=get("epochs", int, 2),
        batch_size=get("batch_size", int, 64),
        steps_per_epoch=get("steps_per_epoch", int, 0),
        restart=get("restart", str, "on-failure", v.choice(RESTART_POLICIES)),
        max_restarts=get("max_restarts", int, 3),
        stall_timeout=get("stall_timeout", Duration, 300.0),
        reconnect_timeout=get("reconnect_timeout", Duration, 300.0),
        keras=get("keras", str, "keras", v.choice(KERAS_CHOICES, 'use "keras" (what `import keras` gives on the '
                                                           'node) or "tf-keras" (tf-keras in its place)')),
        framework=framework,
        min_workers=get("min_workers", int, 0),
        on_fewer_workers=get("on_fewer_workers", str, KEEP_GLOBAL_BATCH,
                             v.choice((KEEP_GLOBAL_BATCH, KEEP_WORKER_BATCH))),
        rejoin=get("rejoin", bool, True),
        checkpoint=get("checkpoint", str, "", _check_checkpoint(v, table)),
        balance=get("balance", str, "speed", v.choice(BALANCE_CHOICES, 'use "speed" (each worker\'s share of a step '
                                                                       'by its speed) or "even"')),
        gpu_memory=_gpu_memory(v, table, path),
        **parse_slurm_job(v, table, path, scheduler),
    )
    _check_worker_ports(v, job)
    _check_script_in_code_dir(v, path, job)
    _check_min_workers(v, table, path, job, node_names)
    _check_framework_keys(v, table, path, job)
    _refuse_trainer_keys(v, table, path, job)
    return job


def _check_script_in_code_dir(v: Validator, path: tuple, job: JobSpec) -> None:
    """A script outside its job's code_dir would never reach the nodes (only code_dir is shipped): refused here,
    where the line can be named, not when a run starts. Both are relative to the cluster file's folder."""
    if not (job.script and job.code_dir):
        return
    base = Path(v.file).parent
    script, code = (os.path.abspath(base / Path(p).expanduser()) for p in (job.script, job.code_dir))
    if os.path.commonpath([script, code]) != code:
        hint = posixpath.join(job.code_dir, posixpath.basename(job.script))
        raise v.fail(path + ("script",), f"{show(job.script)} is not inside code_dir {show(job.code_dir)} (both are "
                     "relative to the cluster file's folder, and only code_dir is shipped to the nodes)",
                     f'give the script\'s path from the cluster file\'s folder, e.g. script = "{hint}"')


def _check_min_workers(v: Validator, table: dict, path: tuple, job: JobSpec, node_names: tuple[str, ...]) -> None:
    """min_workers can be met by the job's layout: at most its nodes × workers_per_node (per-gpu: known at launch);
    on_fewer_workers says what a run without min_workers never does, so it is refused alone rather than ignored."""
    if "on_fewer_workers" in table and not job.min_workers:
        raise v.fail(path + ("on_fewer_workers",), "does nothing without min_workers (a run never goes on with "
                     "fewer workers)", "set min_workers too, the fewest workers a run may go on with, or remove it")
    if not job.min_workers or job.workers_per_node == PER_GPU:
        return
    most = len(job.nodes or node_names) * int(job.workers_per_node)
    if job.min_workers > most:
        raise v.fail(path + ("min_workers",), f"{job.min_workers} is more than the job's {most} workers",
                     f"set it to at most {most}, the fewest workers the run may go on with")


def parse_job_table(name: str, table: dict, node_names: tuple[str, ...], file: str) -> JobSpec:
    """One [jobs.NAME] table validated on its own, outside any file (the queue's `--set KEY=VALUE`): the
    same checks and messages as in cluster.toml; `file` names where the table came from. Raises ConfigError."""
    return parse_job(Validator(file, LineIndex("")), name, table, node_names)


def _refuse_trainer_keys(v: Validator, table: dict, path: tuple, job: JobSpec) -> None:
    """The built-in trainer's keys do nothing for a script, which has its own schedule: said, not ignored."""
    if job.uses_trainer:
        return
    for key in TRAINER_KEYS:
        if key in table:
            raise v.fail(path + (key,), f"the built-in trainer's key, but this job runs {job.script}, which never "
                                        "sees it",
                         f'give the script its own setting in args (e.g. args = ["--{key.replace("_", "-")}", '
                         f'"..."]), or remove {key}')


def _script_framework(config_file: str, script: object, env: object = None) -> str:
    """A job's framework when its table names none, from its script (relative to the cluster file): "jax" for one
    that uses jax.distributed, or Keras with the JAX backend (KERAS_BACKEND set to "jax" in the job's env or by the
    script); "pytorch" for one that uses torch.distributed or DDP and imports no TensorFlow or Keras; else
    "tensorflow"."""
    tree = _script_tree(config_file, script)
    if tree is None:
        return "tensorflow"  # read again at launch; a script that does not parse is Python's to report
    modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    roots = {m.split(".")[0] for m in modules}
    from_jax = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == "jax"
                for alias in node.names}
    if "jax.distributed" in modules or "distributed" in from_jax or _uses(tree, "jax", "distributed") or (
            "keras" in roots and _keras_on_jax(tree, env)):
        return "jax"
    distributed = any(m.startswith(("torch.distributed", "torch.nn.parallel")) for m in modules) or _uses(
        tree, "torch", "distributed")
    tensorflow = bool(roots & {"tensorflow", "keras", "tf_keras"})
    return "pytorch" if distributed and not tensorflow else "tensorflow"


def _script_tree(config_file: str, script: object) -> ast.AST | None:
    """The script's syntax tree; None where there is no script, or it is too large, unreadable or not Python."""
    if not isinstance(script, str) or not script:
        return None
    path = Path(config_file).parent / Path(script).expanduser()
    try:
        if path.stat().st_size > MAX_SCRIPT_BYTES:
            return None
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError, RecursionError):
        return None


def _uses(tree: ast.AST, module: str, attribute: str) -> bool:
    """Whether the script names `module.attribute` (e.g. torch.distributed, jax.distributed.initialize)."""
    return any(isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.value, ast.Name)
               and node.value.id == module for node in ast.walk(tree))


def _keras_on_jax(tree: ast.AST, env: object) -> bool:
    """KERAS_BACKEND is "jax": in the job's env, or set by the script (`os.environ["KERAS_BACKEND"] = "jax"`, as
    keras.io's examples begin)."""
    if isinstance(env, dict) and env.get("KERAS_BACKEND") == "jax":
        return True
    return any(isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value == "jax"
               and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                       and t.slice.value == "KERAS_BACKEND" for t in node.targets) for node in ast.walk(tree))


def _models(framework: str) -> tuple[str, ...]:
    """The `model` values a job of `framework` takes, its default first (the JAX demo takes none)."""
    return TORCH_DEMO_MODELS if framework == "pytorch" else MODELS


def _check_framework_keys(v: Validator, table: dict, path: tuple, job: JobSpec) -> None:
    """The PyTorch and JAX demos train on synthetic data (the PyTorch demo's model is one of its own); a PyTorch job
    runs under torchrun, which starts one process per GPU itself."""
    if job.is_tensorflow:
        return
    name = FRAMEWORK_NAMES[job.framework]
    for key in ("data",) if job.is_pytorch else ("data", "model"):
        if job.uses_trainer and key in table:
            raise v.fail(path + (key,), f"the built-in TensorFlow trainer's key: the {name} demo trains its own "
                                        "model on synthetic data",
                         f'remove {key}, or name your script with script = "train.py"')
    if job.is_pytorch and "workers_per_node" in table:
        raise v.fail(path + ("workers_per_node",), "a PyTorch job runs one torchrun per node, which starts a "
                                                   "process per GPU (one on a node without GPUs)",
                     "remove workers_per_node")
    if job.keras == "tf-keras":
        raise v.fail(path + ("keras",), f"tf-keras runs on TensorFlow, and this is a {name} job",
                     "remove keras")


def _check_checkpoint(v: Validator, table: dict) -> Check:
    """A path in the script's working dir (where it runs), which is what homegpu carries to every worker; only
    with a script (the built-in trainers keep their own backup on every worker)."""
    def check(path: tuple, value: str) -> None:
        v.check_path(path, value)
        if not table.get("script"):
            raise v.fail(path, "the built-in trainer keeps its own backup on every worker", "remove checkpoint")
        if value.startswith(("/", "~")) or ".." in value.split("/") or not value.strip("/."):
            raise v.fail(path, f"{show(value)} is not a path in the script's working dir, the only place homegpu "
                               "carries files from", 'write it relative to where the script runs and saves, e.g. '
                                                     'checkpoint = "snapshot.pt"')
    return check


def _check_worker_ports(v: Validator, job: JobSpec) -> None:
    """Workers on one node take consecutive ports from `port`: the last must still be a port."""
    count = job.most_workers_per_node
    last = job.port + count - 1
    if last > MAX_PORT:
        raise v.fail(("jobs", job.name, "port"),
                     f"its {count} workers per node would use ports {job.port} to {last}, "
                     f"past {MAX_PORT}", f"use a port of at most {MAX_PORT + 1 - count}")


def _workers_per_node(v: Validator, table: dict, path: tuple) -> int | str:
    """A number of workers per node, or "per-gpu"."""
    value = table.get("workers_per_node", 1)
    key_path = path + ("workers_per_node",)
    if isinstance(value, str):
        if value != PER_GPU:
            raise v.fail(key_path, f"unknown layout {show(value)}",
                         f'use "{PER_GPU}" (one worker per GPU) or a number of workers')
        return value
    v.check_type(key_path, value, int)
    v.in_range(*LIMITS["workers_per_node"])(key_path, value)
    return value


def _gpu_memory(v: Validator, table: dict, path: tuple) -> int | str:
    """A size ("5GiB"), or "auto"; 0 when the key is not there (the whole card, as before the key)."""
    if "gpu_memory" not in table:
        return 0
    value, key_path = table["gpu_memory"], path + ("gpu_memory",)
    if value == AUTO:
        return AUTO
    size = size_bytes(value)
    if size is None:
        problem = f"{show(value)} is not a size" if isinstance(value, str) else \
            f"expected a size, got {type_name(value)} {show(value)}"
        raise v.fail(key_path, problem,
                     f'write it like {SIZE_EXAMPLES}, or "auto" (the peak of the job\'s last run)')
    lowest, highest = GPU_MEMORY_RANGE
    if not lowest <= size <= highest:
        raise v.fail(key_path, f"{show(value)} is outside {size_text(lowest)} to {size_text(highest)}",
                     "give what one process of the job holds on its GPU")
    return size


def _check_image(v: Validator) -> Check:
    def check(path: tuple, value: str) -> None:
        if not _IMAGE_RE.fullmatch(value):
            raise v.fail(path, f"invalid image name {show(value)}",
                         'use a Docker image name such as "homegpu/tensorflow:2.21"')
    return check


def _check_strings(v: Validator) -> Check:
    def check(path: tuple, value: list) -> None:
        for item in value:
            if not isinstance(item, str):
                raise v.fail(path, f"{show(item)} is not a string",
                             'write every argument in quotes: args = ["--lr", "0.01"]')
    return check


def _check_data(v: Validator) -> Check:
    def check(path: tuple, value: str) -> None:
        if not _DATA_RE.fullmatch(value):
            raise v.fail(path, f"unknown data source {show(value)}",
                         'use "synthetic", "npz:PATH" (mnist-format) or "dir:PATH" (one folder per class)')
        v.check_safe(path, value, "a data source")
    return check


def _check_env(v: Validator) -> Check:
    def check(path: tuple, value: dict) -> None:
        for key, item in value.items():
            if not _ENV_KEY_RE.fullmatch(key):
                raise v.fail(path + (key,), f"invalid variable name {show(key)}", "use letters, digits and _")
            if not isinstance(item, str):
                raise v.fail(path + (key,), f"value {show(item)} is not a string",
                             f'write it in quotes: {key} = "{show(item)}"')
    return check
