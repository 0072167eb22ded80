"""ProcessRuntime: each worker is a plain process on its node, started with setsid through
node_side/scripts/worker_process.py (shipped as a `python -c` script, so nodes need no homegpu install). For nodes
without Docker; the worker's state lives in files under the run directory.
"""

from __future__ import annotations

import json
import posixpath
from typing import Sequence

from homegpu.remote.logs import LogTail
from homegpu.remote.node_side import script
from homegpu.remote.runtimes.base import (
    STOP_GRACE_SECONDS, NodePaths, Runtime, WorkerLaunch, WorkerStatus,
)
from homegpu.remote.runtimes.errors import RuntimeError_
from homegpu.remote.runtimes.framework_needs import FrameworkNeeds

_TF_SCRIPT = "import tensorflow, tf_keras; print(tensorflow.__version__)"
_TF_DISTS = ("tensorflow,tensorflow-cpu", "tf-keras")  # what _TF_SCRIPT imports, as installed (either name)
_WORKER_SCRIPT = script("worker_process")
_IMPORT_CHECK = script("import_check")
IMPORT_CHECKS_FILE = "import-checks.json"  # in the node's work dir: the imports that worked (import_check.py)


class ProcessRuntime(Runtime):
    """Plain processes started with setsid through node_side/scripts/worker_process.py; for nodes without Docker."""

    def worker_paths(self, run_id: str, label: str, code_dir: str, data_dir: str, job_python: str) -> NodePaths:
        """The node's own paths; the interpreter is the job's `python`, else the node's."""
        return NodePaths(python=job_python or self.node.spec.python, code_dir=code_dir,
                         output_dir=self.out_dir(run_id, label), data_dir=data_dir)

    async def _worker(self, *args: str, timeout: float = 60.0) -> dict:
        # -I -S: the script needs only the standard library; skipping site-packages makes a call
        # that the watch loop makes every second during a run start faster.
        result = await self.node.run([self.node.spec.python, "-I", "-S", "-c", _WORKER_SCRIPT, *args],
                                     timeout=timeout)
        try:
            reply = json.loads(result.stdout.strip().splitlines()[-1]) if result.ok else None
        except (IndexError, ValueError):
            reply = None
        if not isinstance(reply, dict):
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError_(f"{self.node.name}: worker control failed ({detail}); "
                                f"check that {self.node.spec.python} runs on the node")
        return reply

    def _workers(self, reply: dict, labels: Sequence[str] | None = None) -> list[WorkerStatus]:
        """The `workers` of a status reply (one per label asked for, in order) or of a listing."""
        workers = reply.get("workers")
        if not (isinstance(workers, list) and all(isinstance(item, dict) for item in workers)) or (
                labels is not None and len(workers) != len(labels)):
            raise RuntimeError_(f"{self.node.name}: worker control answered {str(reply)[:200]}, not a list of "
                                "workers; check that the node's python runs the standard library's json")
        labels = labels or [str(item.get("label", "?")) for item in workers]  # a listing: the file's name
        return [self._status(label, item) for label, item in zip(labels, workers)]

    def _status(self, label: str, reply: dict) -> WorkerStatus:
        """The node's word on one worker (worker_process.worker_status, which checks its state files
        there); a damaged file comes back as a "damaged" status whose problem names it."""
        if reply.get("state") == "damaged":
            problem = (f"{self.node.name}: {reply.get('file')} is damaged ({reply.get('problem')}); homegpu "
                       f"cannot tell whether that worker runs: check on {self.node.name} (ps), stop it by hand "
                       "if it does, then delete the file")
            return WorkerStatus(label, "damaged", run_id=str(reply.get("run_id", "")), job=str(reply.get("job", "")),
                                problem=problem)
        return WorkerStatus(label=label, state=reply.get("state", "missing"), exit_status=reply.get("status"),
                            generation=reply.get("generation"), run_id=reply.get("run_id", ""),
                            job=reply.get("job", ""), nospace=bool(reply.get("nospace")))

    async def preflight(self, launch: WorkerLaunch) -> list[str]:
        """The worker's python runs and is at least 3.9."""
        python = launch.python
        check = await self.node.run([python, "-c", "import sys; print(sys.version_info >= (3, 9))"], timeout=60)
        if not check.ok or check.stdout.strip() != "True":
            return [f"{self.node.name}: {python} does not run a Python >= 3.9 "
                    f"({(check.stderr.strip().splitlines() or ['not found'])[-1]}); set python in cluster.toml"]
        return []

    async def trainer_problems(self, launch: WorkerLaunch) -> list[str]:
        """TensorFlow and tf-keras import with the worker's python on the node."""
        return (await self._imports(launch.python, (_TF_SCRIPT, *_TF_DISTS), "TensorFlow with tf-keras",
                                    "'tensorflow==2.21.*' 'tf-keras==2.21.*'"))[0]

    async def framework_problems(self, launch: WorkerLaunch, needs: FrameworkNeeds) -> list[str]:
        """The framework imports with the worker's python on the node (its version noted)."""
        problems, version = await self._imports(launch.python, (needs.check, *needs.dists), needs.what,
                                                needs.packages)
        self.framework_version = version
        return problems

    async def _imports(self, python: str, check: tuple[str, ...], what: str, packages: str) -> tuple[list[str], str]:
        """(the problem, if `check`'s script fails with `python` on the node; the last line it printed). `check`: the
        script and the distributions it imports; the node imports them again only when those changed since an
        import there last worked (node_side/scripts/import_check.py)."""
        state = posixpath.join(posixpath.dirname(self.run_root), IMPORT_CHECKS_FILE)
        result = await self.node.run([python, "-c", _IMPORT_CHECK, state, *check], timeout=180)
        if result.ok:
            return [], (result.stdout.strip().splitlines() or [""])[-1]
        return [f"{self.node.name}: {what} is not importable by {python}; install it there: "
                f"{python} -m pip install {packages}"], ""

    async def start(self, launch: WorkerLaunch) -> None:
        meta = {"job": launch.job, "run_id": launch.run_id, "index": launch.slot.index,
                "generation": launch.generation}
        env = {**launch.env, **({"TF_CONFIG": launch.tf_config} if launch.tf_config else {})}
        args = ["start", "--run-dir", self.run_dir(launch.run_id), "--label", launch.label,
                "--log", _log_name(launch.label, launch.generation), "--meta", json.dumps(meta), "--cwd", launch.cwd,
                "--mkdir", launch.output_dir]
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        reply = await self._worker(*args, "--", *launch.argv)
        if "error" in reply:
            raise RuntimeError_(f"{self.node.name}: {reply['error']}")

    async def status(self, run_id: str, label: str) -> WorkerStatus:
        return (await self.statuses(run_id, [label]))[0]

    async def statuses(self, run_id: str, labels: Sequence[str]) -> list[WorkerStatus]:
        reply = await self._worker("status", "--run-dir", self.run_dir(run_id),
                                   *(arg for label in labels for arg in ("--label", label)))
        return self._workers(reply, labels)

    async def stop(self, run_id: str, label: str, grace: float = STOP_GRACE_SECONDS) -> WorkerStatus:
        reply = await self._worker("stop", "--run-dir", self.run_dir(run_id), "--label", label,
                                   "--grace", f"{grace:g}", timeout=grace + 30)
        return self._status(label, reply)

    async def list_workers(self) -> list[WorkerStatus]:
        return self._workers(await self._worker("list", "--root", self.run_root))

    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        return LogTail.file(self.node, f"{self.run_dir(run_id)}/{_log_name(label, generation)}", follow, **kwargs)


def _log_name(label: str, generation: int) -> str:
    return f"{label}.g{generation}.log"
