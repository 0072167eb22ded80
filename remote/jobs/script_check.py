"""What a script cannot train with, caught before launch by reading the job's code: Keras 3 under
MultiWorkerMirroredStrategy, and PyTorch's nccl backend on a plan with a process on a CPU.

TensorFlow 2.16+ makes `import keras` Keras 3, and Keras 3's `fit` cannot train under
MultiWorkerMirroredStrategy (keras-team/keras#20585): every worker dies in its first step with a
tensor dump. tf-keras can (`import tf_keras as keras`, or `tf.keras` with TF_USE_LEGACY_KERAS=1, which
every worker gets). So a multi-worker run of code that imports `keras` itself and builds that strategy
is refused, in one line naming the file:line and both fixes, before anything starts. Likewise a
PyTorch script whose `init_process_group` names "nccl" outright, when the device plan runs a process on
a node without a GPU: NCCL moves tensors between GPUs only, and that process would fail at its first
collective. The files are parsed with `ast` (nothing is executed); a file that does not parse is left to
Python to report.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from homegpu.remote.config import JobSpec
from homegpu.remote.jobs.codesync import SKIP_DIRS
from homegpu.remote.jobs.launch_plan import local_code, script_rel
from homegpu.remote.plan import DevicePlan

STRATEGY = "MultiWorkerMirroredStrategy"
MAX_FILES = 2000  # a code dir bigger than this is read only this far (a dataset of .py files, say)
MAX_FILE_BYTES = 2 << 20  # a generated file this large is no training script


@dataclass(frozen=True)
class KerasImport:
    """Where code imports Keras 3 by its own name: `statement` as written, at `path`:`line`."""

    path: Path
    line: int
    statement: str


def _walk(root: Path) -> Iterator[Path]:
    count = 0
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                count += 1
                if count > MAX_FILES:
                    return
                yield Path(folder) / name


def keras3_imports(source: str) -> tuple[list[tuple[int, str]], bool]:
    """The lines of `source` that import `keras` itself (not tf_keras, not tensorflow.keras), each with
    the statement as written; and whether it names MultiWorkerMirroredStrategy. Raises SyntaxError."""
    imports, strategy = [], False
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(_is_keras(alias.name) for alias in node.names):
            imports.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_keras(node.module or ""):
            imports.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Attribute) and node.attr == STRATEGY) or \
                (isinstance(node, ast.Name) and node.id == STRATEGY) or \
                (isinstance(node, ast.alias) and node.name == STRATEGY):
            strategy = True
    return sorted(imports), strategy


def _is_keras(module: str) -> bool:
    return module == "keras" or module.startswith("keras.")


def _read(files: list[Path], reader):
    """(path, reader(its text)) for each file that can be read and parsed."""
    for path in files:
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            yield path, reader(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue  # unreadable or not Python 3: the worker's own traceback will say so


def find_keras3_under_mwms(files: list[Path]) -> KerasImport | None:
    """The first import of Keras 3 in `files`, when any of them builds MultiWorkerMirroredStrategy."""
    first, strategy = None, False
    for path, (imports, names_strategy) in _read(files, keras3_imports):
        strategy = strategy or names_strategy
        if imports and first is None:
            first = KerasImport(path, *imports[0])
    return first if strategy else None


def nccl_calls(source: str) -> list[tuple[int, str]]:
    """The `init_process_group` calls of `source` whose backend is the literal "nccl" (by keyword or as the
    first argument), each with its line and the call as written. Raises SyntaxError."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or _name_of(node.func) != "init_process_group":
            continue
        backend = next((k.value for k in node.keywords if k.arg == "backend"), node.args[0] if node.args else None)
        if isinstance(backend, ast.Constant) and backend.value == "nccl":
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _name_of(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def nccl_on_cpu_problem(job: JobSpec, config_source: str, plan: DevicePlan | None) -> str:
    """One line refusing a PyTorch script that names nccl when a process of the plan has no GPU; "" when fine."""
    cpu = next((w for w in plan.workers if w.on_cpu), None) if plan and job.is_pytorch else None
    if cpu is None:
        return ""
    for path, calls in _read(job_files(job, config_source), nccl_calls):
        if calls:
            line, call = calls[0]
            return (f"{_shown(path)}:{line}: `{call}` needs a GPU in every process, but {cpu.node} has none "
                    f"(NCCL moves tensors between GPUs only); write backend=\"nccl\" if torch.cuda.is_available() "
                    f"else \"gloo\" there, or leave {cpu.node} out with nodes = [...] in [jobs.{job.name}]")
    return ""


def keras3_problem(job: JobSpec, config_source: str, workers: int) -> str:
    """One line refusing a multi-worker run of a script that would train with Keras 3; "" when fine."""
    if job.uses_trainer or not job.is_tensorflow or job.keras == "tf-keras" or workers < 2:
        return ""  # one worker: Keras 3 trains under the strategy alone (checked on TF 2.21)
    found = find_keras3_under_mwms(job_files(job, config_source))
    if found is None:
        return ""
    return (f"{_shown(found.path)}:{found.line}: `{found.statement}` is Keras 3, which cannot train under "
            f"MultiWorkerMirroredStrategy (keras-team/keras#20585); write `import tf_keras as keras` there, "
            f"or set keras = \"tf-keras\" in [jobs.{job.name}] to run the script unchanged with tf-keras, or "
            f"train with Keras 3 on JAX: framework = \"jax\" and keras.distribution.DataParallel (docs: "
            f"your-script.md, A JAX script)")


def job_files(job: JobSpec, config_source: str) -> list[Path]:
    """The .py files code sync ships, the script first (its import is the one to name)."""
    root = local_code(job, config_source)
    try:
        script = root / script_rel(job, config_source)
    except ValueError:  # the script lies outside code_dir: preflight says so
        return list(_walk(root))
    return [script, *(path for path in _walk(root) if path != script)]


def _shown(path: Path) -> str:
    """`path` as the user would type it here: relative to the working dir when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
