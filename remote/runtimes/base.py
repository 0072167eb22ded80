"""How a worker runs on a node: the contract every runtime keeps, and the data it is handed.

A runtime turns a WorkerLaunch (pure data: what to run, with which TF_CONFIG, where on the node)
into a running worker and answers for it afterwards. State lives on the node (pid files, container
labels), so any homegpu process can find, follow and stop workers it did not start.
Implementations: process_runtime.ProcessRuntime, docker_runtime.DockerRuntime; factory.make_runtime picks one.
"""

from __future__ import annotations

import abc
import asyncio
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Sequence

from homegpu.remote.logs import LogTail
from homegpu.remote.nodes import NodeSession
from homegpu.remote.plan import DevicePlan, WorkerDevices, WorkerSlot, process_env
from homegpu.remote.runtimes.framework_needs import FrameworkNeeds


STOP_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class NodePaths:
    """Where things are, as the worker sees them (a container sees other paths than its node):
    what the worker's command line and environment name."""

    python: str
    code_dir: str
    output_dir: str
    data_dir: str = ""


@dataclass(frozen=True)
class WorkerLaunch:
    """Everything needed to start one worker of one generation of a run.

    `argv`, `cwd`, `env` and `python` are as the worker sees them (NodePaths); `code_dir`,
    `output_dir` and `data_dir` are paths on the node (what a container gets mounted).
    `device_ids`: the node's GPUs a container gets (the device plan's; empty: none, a CPU worker);
    None without a plan (a container then gets every GPU of a node that has some).
    """

    job: str
    run_id: str
    generation: int
    slot: WorkerSlot
    tf_config: str
    argv: tuple[str, ...]
    cwd: str
    python: str  # the interpreter that runs the worker (argv's first word for the trainer)
    code_dir: str  # the job's synced code on the node
    output_dir: str  # the worker's output dir on the node (Runtime.out_dir)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    image: str = ""
    data_dir: str = ""  # the job's data_dir on the node; may start with ~ (see expand_path)
    device_ids: tuple[str, ...] | None = None

    @property
    def label(self) -> str:
        return self.slot.label


@dataclass(frozen=True)
class WorkerStatus:
    """What the node says about a worker: running, exited (with status), vanished, missing, or
    damaged (a state file on the node is not what homegpu writes: `problem` names node, file and
    what to do)."""

    label: str
    state: str
    exit_status: int | None = None
    generation: int | None = None
    run_id: str = ""
    job: str = ""
    nospace: bool = False  # its supervisor met a full disk (its exit status was still recorded)
    problem: str = ""

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
        """Returns: the run's directory on the node (logs, pid files, workers' output)."""
        return f"{self.run_root}/{run_id}"

    def out_dir(self, run_id: str, label: str) -> str:
        """Returns: the worker's output dir on the node (the model lands in its `model/`)."""
        return f"{self.run_dir(run_id)}/out/{label}"

    def device_env(self, plan: DevicePlan, worker: WorkerDevices) -> dict[str, str]:
        """The environment that gives a worker its devices and the collective: a process sees
        exactly its GPUs through CUDA_VISIBLE_DEVICES (DockerRuntime: its device request does)."""
        return process_env(plan, worker)

    @abc.abstractmethod
    def worker_paths(self, run_id: str, label: str, code_dir: str, data_dir: str, job_python: str) -> NodePaths:
        """Where the worker will see its code, output, data and interpreter. Pure: no state kept.

        Args:
            code_dir: the synced code on the node.
            data_dir: the job's data_dir on the node, or "".
            job_python: the job's `python`, or "" for the runtime's default interpreter.

        Returns:
            The paths for the worker's command line and environment.
        """

    @abc.abstractmethod
    async def preflight(self, launch: WorkerLaunch) -> list[str]:
        """Check that this runtime can start `launch` on the node.

        Returns:
            One line per problem, naming the node and the fix; empty when ready.
        """

    @abc.abstractmethod
    async def trainer_problems(self, launch: WorkerLaunch) -> list[str]:
        """Check that the built-in trainer's TensorFlow is importable where `launch` would run.

        Returns:
            One line per problem, naming the node and the fix; empty when ready.
        """

    # the framework's version the last framework_problems() found on the node ("" unknown)
    framework_version = ""

    async def framework_problems(self, launch: WorkerLaunch, needs: FrameworkNeeds) -> list[str]:
        """Check that a PyTorch or JAX job's framework is importable where `launch` would run, noting its version
        (framework_version).

        Returns:
            One line per problem, naming the node and the fix; empty when ready.
        """
        return []

    @abc.abstractmethod
    async def start(self, launch: WorkerLaunch) -> None:
        """Start the worker detached.

        Raises:
            RuntimeError_: naming the node and the fix.
        """

    @abc.abstractmethod
    async def status(self, run_id: str, label: str) -> WorkerStatus:
        """Returns: what the node says of the worker's newest generation (state "missing" if none)."""

    async def statuses(self, run_id: str, labels: Sequence[str]) -> list[WorkerStatus]:
        """status() of several workers of the run, in order; a runtime that can ask for all of
        them in one round trip does."""
        return list(await asyncio.gather(*(self.status(run_id, label) for label in labels)))

    @abc.abstractmethod
    async def stop(self, run_id: str, label: str, grace: float = STOP_GRACE_SECONDS) -> WorkerStatus:
        """TERM, wait up to `grace` seconds, then KILL. Safe to call on a worker that ended.

        Returns:
            The worker's status once stopped.
        """

    async def remove(self, run_id: str, label: str) -> None:
        """Remove what a stopped worker leaves behind (containers); nothing for processes."""

    @abc.abstractmethod
    async def list_workers(self) -> list[WorkerStatus]:
        """Returns: every worker this node knows of, running or not (for reattaching and `homegpu jobs`)."""

    @abc.abstractmethod
    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        """Returns: a (not yet started) LogTail of one generation of the worker's output, from its
        first line; with follow=False it ends at the end of what there is now."""


async def expand_path(node: NodeSession, path: str) -> str:
    """`path` with a leading ~ expanded for the node's user (quoted argv never meet a shell that would)."""
    if path == "~" or path.startswith("~/"):
        return (await node.home_dir()).rstrip("/") + path[1:]
    return path
