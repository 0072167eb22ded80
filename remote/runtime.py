"""How a worker runs on a node: one interface, a process runtime here, a Docker one in docker_runtime.

A runtime turns a WorkerLaunch (pure data: what to run, with which TF_CONFIG) into a running worker
and answers for it afterwards. State lives on the node (pid files, container labels), so any
homegpu process can find, follow and stop workers it did not start.
"""

from __future__ import annotations

import abc
import asyncio
import json
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Mapping, Sequence

from homegpu.remote.logtail import LogTail
from homegpu.remote.node import NodeSession
from homegpu.remote.tfconfig import WorkerSlot

STOP_GRACE_SECONDS = 10.0


class RuntimeError_(Exception):
    """A runtime could not do what was asked; the message names the node and the fix."""


@dataclass(frozen=True)
class NodePaths:
    """Where things are, as the worker sees them (a container sees other paths than its node)."""

    python: str
    code_dir: str
    output_dir: str
    data_dir: str = ""


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything needed to start one worker of one generation of a run."""

    job: str
    run_id: str
    generation: int
    slot: WorkerSlot
    tf_config: str
    argv: tuple[str, ...]
    cwd: str
    output_dir: str = ""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    image: str = ""
    data_dir: str = ""

    @property
    def label(self) -> str:
        return self.slot.label


@dataclass(frozen=True)
class WorkerStatus:
    """What the node says about a worker: running, exited (with status), vanished or missing."""

    label: str
    state: str
    exit_status: int | None = None
    generation: int | None = None
    run_id: str = ""
    job: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"


class Runtime(abc.ABC):
    """One node's way of running workers."""

    def __init__(self, node: NodeSession, run_root: str) -> None:
        """`run_root`: an absolute path on the node (see expand_path) under which runs live."""
        self.node = node
        self.run_root = run_root.rstrip("/")

    def run_dir(self, run_id: str) -> str:
        return f"{self.run_root}/{run_id}"

    @abc.abstractmethod
    def paths(self, run_id: str, code_dir: str, label: str, data_dir: str, python: str) -> NodePaths:
        """Paths for the worker's command line as the worker will see them."""

    @abc.abstractmethod
    async def preflight(self, launch: WorkerLaunch) -> list[str]:
        """Problems that would stop this worker from starting (empty when ready)."""

    @abc.abstractmethod
    async def start(self, launch: WorkerLaunch) -> None:
        """Start the worker detached. Raises RuntimeError_ naming the node and the fix."""

    @abc.abstractmethod
    async def status(self, run_id: str, label: str) -> WorkerStatus: ...

    async def statuses(self, run_id: str, labels: Sequence[str]) -> list[WorkerStatus]:
        """status() of several workers of the run, in order; a runtime that can ask for all of
        them in one round trip does."""
        return list(await asyncio.gather(*(self.status(run_id, label) for label in labels)))

    @abc.abstractmethod
    async def stop(self, run_id: str, label: str, grace: float = STOP_GRACE_SECONDS) -> WorkerStatus:
        """TERM, wait up to `grace` seconds, then KILL. Safe to call on a worker that ended."""

    async def remove(self, run_id: str, label: str) -> None:
        """Remove what a stopped worker leaves behind (containers); nothing for processes."""

    @abc.abstractmethod
    async def list_workers(self) -> list[WorkerStatus]:
        """Every worker this node knows of, running or not (for reattaching and `homegpu jobs`)."""

    @abc.abstractmethod
    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        """A (not yet started) LogTail of one generation of the worker's output, from its first
        line; with follow=False it ends at the end of what there is now."""


async def expand_path(node: NodeSession, path: str) -> str:
    """`path` with a leading ~ expanded for the node's user (quoted argv never meet a shell that would)."""
    if path == "~" or path.startswith("~/"):
        return (await node.home_dir()).rstrip("/") + path[1:]
    return path


def make_runtime(node: NodeSession, run_root: str) -> Runtime:
    """The node's runtime from cluster.toml; Docker nodes get GPUs when their stats show some."""
    if node.spec.runtime == "docker":
        from homegpu.remote.docker_runtime import DockerRuntime

        return DockerRuntime(node, run_root, gpus=bool(node.latest and node.latest.gpus))
    return ProcessRuntime(node, run_root)


# -- process runtime ------------------------------------------------------------------------------

_WORKER_SCRIPT = resources.files("homegpu.remote").joinpath("proc_worker.py").read_text()


class ProcessRuntime(Runtime):
    """Plain processes started with setsid through proc_worker.py; for nodes without Docker."""

    def paths(self, run_id: str, code_dir: str, label: str, data_dir: str, python: str) -> NodePaths:
        return NodePaths(python=python, code_dir=code_dir, output_dir=f"{self.run_dir(run_id)}/out/{label}",
                         data_dir=data_dir)

    async def _worker(self, *args: str, timeout: float = 60.0) -> dict:
        # -I -S: the script needs only the standard library; skipping site-packages makes a call
        # that the watch loop makes every second during a run start faster.
        result = await self.node.run([self.node.spec.python, "-I", "-S", "-c", _WORKER_SCRIPT, *args],
                                     timeout=timeout)
        if not result.ok:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError_(f"{self.node.name}: worker control failed ({detail}); "
                                f"check that {self.node.spec.python} runs on the node")
        return json.loads(result.stdout.strip().splitlines()[-1])

    async def preflight(self, launch: WorkerLaunch) -> list[str]:
        python = launch.argv[0]
        check = await self.node.run([python, "-c", "import sys; print(sys.version_info >= (3, 9))"], timeout=60)
        if not check.ok or check.stdout.strip() != "True":
            return [f"{self.node.name}: {python} does not run a Python >= 3.9 "
                    f"({(check.stderr.strip().splitlines() or ['not found'])[-1]}); set python in cluster.toml"]
        return []

    async def start(self, launch: WorkerLaunch) -> None:
        meta = {"job": launch.job, "run_id": launch.run_id, "index": launch.slot.index,
                "generation": launch.generation}
        env = {**launch.env, "TF_CONFIG": launch.tf_config}
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
        return [_status(item["label"], item) for item in reply["workers"]]

    async def stop(self, run_id: str, label: str, grace: float = STOP_GRACE_SECONDS) -> WorkerStatus:
        reply = await self._worker("stop", "--run-dir", self.run_dir(run_id), "--label", label,
                                   "--grace", f"{grace:g}", timeout=grace + 30)
        return _status(label, reply)

    async def list_workers(self) -> list[WorkerStatus]:
        reply = await self._worker("list", "--root", self.run_root)
        return [_status(item["label"], item) for item in reply["workers"]]

    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        return LogTail.file(self.node, f"{self.run_dir(run_id)}/{_log_name(label, generation)}", follow, **kwargs)


def _log_name(label: str, generation: int) -> str:
    return f"{label}.g{generation}.log"


def _status(label: str, reply: dict) -> WorkerStatus:
    return WorkerStatus(label=label, state=reply.get("state", "missing"), exit_status=reply.get("status"),
                        generation=reply.get("generation"), run_id=reply.get("run_id", ""),
                        job=reply.get("job", ""))
