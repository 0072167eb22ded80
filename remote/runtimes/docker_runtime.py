"""DockerRuntime: each worker is a detached container on its node, driven through the Docker API.

Containers use the host network (TensorFlow's gRPC ports are the node's own), get the node's GPUs
through a device request when it has any, and carry labels (job, run, node, index, generation,
label) that are the only state: any homegpu process finds, follows and stops them by label.

Inside every container the same paths hold, whatever the node's layout:
/homegpu/code (the synced code, read-only), /homegpu/out (this worker's output dir on the node,
read-write) and /data (the job's data_dir, read-only). Containers run as the SSH user's uid:gid,
so what they write stays that user's to read and delete.

Logs are followed with `docker logs -f` run on the node through LogTail.command: it already
resumes after a reconnect (docker logs replays from the start; seen lines are skipped) and is
killed with the SSH session. A docker-py log stream would need a second, forwarded-socket flavour
of LogTail for the same result, so the runtime asks for the docker CLI in preflight instead.
"""

from __future__ import annotations

import asyncio
import re
from typing import Mapping, NamedTuple

import docker.errors
from docker.types import DeviceRequest, Mount

from homegpu.remote.logs import LogTail
from homegpu.remote.node_side import LABEL_BUDGET, LABEL_INDEX, LABEL_JOB, LABEL_RUN, MARKER_BUDGET
from homegpu.remote.nodes import NodeSession, TransportError
from homegpu.remote.plan import DevicePlan, WorkerDevices, container_env
from homegpu.remote.runtimes.base import (
    STOP_GRACE_SECONDS, NodePaths, Runtime, WorkerLaunch, WorkerStatus, expand_path,
)
from homegpu.remote.runtimes.docker_link import DockerLink, DockerUnavailable, docker_client
from homegpu.remote.runtimes.errors import RuntimeError_
from homegpu.remote.runtimes.framework_needs import FrameworkNeeds

CODE_DIR = "/homegpu/code"
OUT_DIR = "/homegpu/out"
DATA_DIR = "/data"
CONTAINER_PYTHON = "python3"  # the official TensorFlow images and the test image both have it on PATH
LABEL_PREFIX = "homegpu."
SHM_SIZE = "1g"  # Docker's 64 MB /dev/shm is too small for NCCL and tf.data on GPU nodes

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_RUNNING_STATES = {"running", "restarting", "paused"}
# One round trip for two facts: the SSH user's uid and gid (containers run as that user, so what
# a worker writes stays the user's) and the docker CLI on PATH (worker logs are followed with it).
_NODE_SCRIPT = "import os, shutil; print(os.getuid(), os.getgid(), shutil.which('docker') or '-')"
_NO_GPU_DRIVER = "could not select device driver"


class _NodeFacts(NamedTuple):
    user: str  # "uid:gid", or "" when the node did not say (containers then run as the image's user)
    docker_cli: bool | None  # None: unknown, see error
    error: str = ""


def container_name(run_id: str, label: str, generation: int) -> str:
    """`homegpu-RUN-LABEL-gN`, with characters Docker refuses in names (the `#` of a slot) as `_`."""
    return _NAME_UNSAFE.sub("_", f"homegpu-{run_id}-{label}-g{generation}")


def worker_labels(launch: WorkerLaunch) -> dict[str, str]:
    return {
        LABEL_JOB: launch.job,  # the three the node's agent reads to tell a worker (process_owners.py)
        LABEL_RUN: launch.run_id,
        f"{LABEL_PREFIX}node": launch.slot.node.name,
        LABEL_INDEX: str(launch.slot.index),
        f"{LABEL_PREFIX}generation": str(launch.generation),
        f"{LABEL_PREFIX}label": launch.label,
        # its gpu_memory, for the agent where the container's environment is not its to read
        **({LABEL_BUDGET: launch.env[MARKER_BUDGET]} if launch.env.get(MARKER_BUDGET) else {}),
    }


def container_args(launch: WorkerLaunch, *, code_dir: str, out_dir: str, data_dir: str, gpus: bool,
                   user: str = "") -> dict:
    """Keyword arguments for docker-py's `containers.create` (pure: table-tested without Docker).

    `code_dir`, `out_dir` and `data_dir` are absolute paths on the node; `data_dir` may be empty.
    `gpus` (every GPU of the node) counts only when the launch has no device plan (`device_ids`).
    """
    mounts = [Mount(CODE_DIR, code_dir, type="bind", read_only=True),
              Mount(OUT_DIR, out_dir, type="bind", read_only=False)]
    if data_dir:
        mounts.append(Mount(DATA_DIR, data_dir, type="bind", read_only=True))
    args = {
        "image": launch.image,
        "command": list(launch.argv),
        "name": container_name(launch.run_id, launch.label, launch.generation),
        "network_mode": "host",
        "labels": worker_labels(launch),
        "environment": {"HOME": "/tmp", **launch.env, **({"TF_CONFIG": launch.tf_config} if launch.tf_config else {})},
        "working_dir": launch.cwd,
        "mounts": mounts,
        "init": True,  # a real PID 1 passes `docker stop`'s TERM on to python, which ignores it as PID 1
        "shm_size": SHM_SIZE,
    }
    if user:
        args["user"] = user
    if launch.device_ids is not None:  # the device plan's GPUs; a CPU worker gets no request
        if launch.device_ids:
            args["device_requests"] = [DeviceRequest(device_ids=list(launch.device_ids), capabilities=[["gpu"]])]
    elif gpus:
        args["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    return args


def status_from_attrs(attrs: Mapping) -> WorkerStatus:
    """A WorkerStatus from a container's inspect data (or a `containers.list` entry's attrs)."""
    labels = attrs.get("Config", {}).get("Labels") or {}
    state = attrs.get("State", {})
    docker_state = state.get("Status", "")
    generation = labels.get(f"{LABEL_PREFIX}generation", "")
    if docker_state in _RUNNING_STATES:
        ours, exit_status = "running", None
    elif docker_state == "exited":
        ours, exit_status = "exited", state.get("ExitCode")
    elif docker_state == "created":  # start() is between create and start: not there yet
        ours, exit_status = "missing", None
    else:  # removing, dead: it will not run again, and has no real exit status
        ours, exit_status = "vanished", None
    return WorkerStatus(label=labels.get(f"{LABEL_PREFIX}label", ""), state=ours, exit_status=exit_status,
                        generation=int(generation) if generation.isdigit() else None,
                        run_id=labels.get(f"{LABEL_PREFIX}run", ""), job=labels.get(f"{LABEL_PREFIX}job", ""))


class DockerRuntime(Runtime):
    """Workers as containers on one node.

    Args:
        gpus: give containers every GPU of the node (a device request) when a launch has no device
            plan (WorkerLaunch.device_ids None; with a plan, a container gets exactly its GPUs). The
            caller decides from the node's stats; a request on a node without the NVIDIA Container
            Toolkit fails.
    """

    def __init__(self, node: NodeSession, run_root: str, *, gpus: bool = False) -> None:
        super().__init__(node, run_root)
        self.gpus = gpus
        self._node: _NodeFacts | None = None

    def device_env(self, plan: DevicePlan, worker: WorkerDevices) -> dict[str, str]:
        """The container's device request (WorkerLaunch.device_ids) already limits it to its GPUs."""
        return container_env(plan, worker)

    def worker_paths(self, run_id: str, label: str, code_dir: str, data_dir: str, job_python: str) -> NodePaths:
        """The container's paths. The interpreter is the job's `python`, else the image's python3
        (the node's own `python` in cluster.toml runs homegpu's helpers on the node and means
        nothing inside the image)."""
        return NodePaths(python=job_python or CONTAINER_PYTHON, code_dir=CODE_DIR, output_dir=OUT_DIR,
                         data_dir=DATA_DIR if data_dir else "")

    # -- checks ----------------------------------------------------------------------------------

    async def preflight(self, launch: WorkerLaunch) -> list[str]:
        """Engine reachable, image present, docker CLI there (logs are followed with it)."""
        if not launch.image:
            return [f"{self.node.name}: the job names no image; set image in [jobs.{launch.job}]"]
        engine, facts = await asyncio.gather(self._engine_problems(launch.image), self._node_facts())
        problems = list(engine)
        if facts.error:
            problems.append(facts.error)
        elif not facts.docker_cli:
            problems.append(f"{self.node.name}: the docker command is missing (homegpu follows worker logs "
                            "with `docker logs`); install the Docker CLI (docker-ce-cli or docker.io)")
        return problems

    async def trainer_problems(self, launch: WorkerLaunch) -> list[str]:
        """Nothing to ask the node: TensorFlow comes with the image, which preflight checks is there."""
        return []

    async def framework_problems(self, launch: WorkerLaunch, needs: FrameworkNeeds) -> list[str]:
        """The framework imports in the job's image (one container, no network), its version noted
        (framework_version); a missing image or engine is preflight's to name."""
        try:
            async with docker_client(self.node) as link:
                check = [launch.python, "-c", needs.check]
                imported, said = await link.call(_run_once, link.client, launch.image, check)
        except (docker.errors.NotFound, DockerUnavailable):
            return []
        if imported:
            self.framework_version = said
            return []
        build = f"homegpu image build --framework {needs.framework} --node {self.node.name}"
        return [f"{self.node.name}: {needs.what} does not import in image {launch.image} ({said}); build the "
                f"{needs.name} image there ({build}) or set image in [jobs.{launch.job}]"]

    async def _engine_problems(self, image: str) -> list[str]:
        try:
            async with docker_client(self.node) as link:
                return await self._image_problems(link, image)
        except DockerUnavailable as exc:
            return [str(exc)]

    async def _image_problems(self, link: DockerLink, image: str) -> list[str]:
        try:
            await link.call(link.api.inspect_image, image)
        except docker.errors.NotFound:
            return [missing_image_message(image, self.node.name)]
        return []

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, launch: WorkerLaunch) -> None:
        """Create and start the worker's container, mounting the launch's node paths.

        Raises:
            RuntimeError_: naming the node and the fix (DockerUnavailable when the engine fails).
        """
        await self._mkdir(launch.output_dir)
        data_dir = await expand_path(self.node, launch.data_dir) if launch.data_dir else ""
        args = container_args(launch, code_dir=launch.code_dir, out_dir=launch.output_dir, data_dir=data_dir,
                              gpus=self.gpus, user=(await self._node_facts()).user)
        async with docker_client(self.node) as link:
            await self._clear_name(link, args["name"])
            container = await self._create(link, args)
            try:
                await link.call(container.start)
            except Exception as exc:
                await link.call(container.remove, force=True)
                error = _start_error(self.node.name, exc)
                if error is exc:
                    raise
                raise error from exc

    async def _create(self, link: DockerLink, args: dict):
        try:
            return await link.call(link.client.containers.create, **args)
        except docker.errors.NotFound:
            raise RuntimeError_(missing_image_message(args["image"], self.node.name)) from None

    async def _mkdir(self, path: str) -> None:
        """Create `path` on the node as the SSH user (Docker would create a missing one as root)."""
        try:  # over SFTP: no login shell to start
            await self.node.makedirs(path)
        except TransportError as exc:
            raise RuntimeError_(f"{self.node.name}: {exc}; check work_dir in cluster.toml") from None

    async def _node_facts(self) -> _NodeFacts:
        """The SSH user's `uid:gid` and whether the docker CLI is on PATH, asked once."""
        if self._node is None:
            python = self.node.spec.python
            result = await self.node.run([python, "-c", _NODE_SCRIPT], timeout=30)
            uid, gid, cli = (result.stdout.split() + ["", "", ""])[:3]
            if not (result.ok and uid.isdigit() and gid.isdigit()):
                said = (result.stderr.strip().splitlines() or [f"exit status {result.exit_status}"])[-1]
                return _NodeFacts("", None, f"{self.node.name}: {python} does not run on the node ({said}); "
                                  "install python3 there or set python for the node in cluster.toml")
            self._node = _NodeFacts(f"{uid}:{gid}", cli.startswith("/"))
        return self._node

    async def _clear_name(self, link: DockerLink, name: str) -> None:
        """Remove an ended container holding `name` (a start that failed half-way); refuse a live one."""
        try:
            attrs = await link.call(link.api.inspect_container, name)
        except docker.errors.NotFound:
            return
        if attrs.get("State", {}).get("Status") in _RUNNING_STATES:
            raise RuntimeError_(f"{self.node.name}: container {name} is already running; "
                                "stop the run first (homegpu stop)")
        await link.call(link.api.remove_container, name, force=True)

    async def status(self, run_id: str, label: str) -> WorkerStatus:
        """The newest generation's container of this worker; state "missing" when there is none."""
        async with docker_client(self.node) as link:
            return await self._status(link, run_id, label)

    async def _status(self, link: DockerLink, run_id: str, label: str) -> WorkerStatus:
        found = await self._containers(link, run_id, label)
        if not found:
            return WorkerStatus(label=label, state="missing", run_id=run_id)
        return max((status_from_attrs(c.attrs) for c in found), key=lambda s: s.generation or 0)

    async def stop(self, run_id: str, label: str, grace: float = STOP_GRACE_SECONDS) -> WorkerStatus:
        """`docker stop` every generation's container that runs: TERM, `grace` seconds, then KILL."""
        async with docker_client(self.node) as link:
            for container in await self._containers(link, run_id, label):
                if status_from_attrs(container.attrs).running:
                    try:
                        await link.call(link.api.stop, container.id, timeout=max(0, round(grace)))
                    except docker.errors.NotFound:
                        pass  # removed meanwhile: stopped, as asked
            return await self._status(link, run_id, label)

    async def remove(self, run_id: str, label: str) -> None:
        """Remove the worker's containers of every generation (running ones are killed)."""
        async with docker_client(self.node) as link:
            for container in await self._containers(link, run_id, label):
                try:
                    await link.call(link.api.remove_container, container.id, force=True)
                except docker.errors.NotFound:
                    pass

    async def list_workers(self) -> list[WorkerStatus]:
        """Every homegpu container of this node, newest generation per (run, label)."""
        async with docker_client(self.node) as link:
            found = await link.call(link.client.containers.list, all=True, ignore_removed=True,
                                    filters={"label": [f"{LABEL_PREFIX}node={self.node.name}"]})
        newest: dict[tuple[str, str], WorkerStatus] = {}
        for status in map(status_from_attrs, (c.attrs for c in found)):
            key = (status.run_id, status.label)
            if key not in newest or (status.generation or 0) > (newest[key].generation or 0):
                newest[key] = status
        return sorted(newest.values(), key=lambda s: (s.run_id, s.label))

    async def _containers(self, link: DockerLink, run_id: str, label: str) -> list:
        filters = {"label": [f"{LABEL_PREFIX}node={self.node.name}", f"{LABEL_PREFIX}run={run_id}",
                             f"{LABEL_PREFIX}label={label}"]}
        return await link.call(link.client.containers.list, all=True, ignore_removed=True, filters=filters)

    # -- logs ------------------------------------------------------------------------------------

    def tail(self, run_id: str, label: str, generation: int, follow: bool = True, **kwargs) -> LogTail:
        """`docker logs [-f]` of one generation's container, stdout and stderr merged, on the node."""
        name = container_name(run_id, label, generation)
        return LogTail.command(self.node, logs_argv(self.node.spec.docker_socket, name, follow),
                               label=name, **kwargs)


def logs_argv(docker_socket: str, name: str, follow: bool = True) -> list[str]:
    """The node-side command printing a container's output (stderr too: TensorFlow logs there)."""
    return ["sh", "-c", 'exec "$@" 2>&1', "sh", "docker", "--host", f"unix://{docker_socket}", "logs",
            *(["--follow"] if follow else []), name]


def _run_once(client: docker.DockerClient, image: str, argv: list[str]) -> tuple[bool, str]:
    """Run argv in a throwaway container of `image` without network: (it exited 0, its last line)."""
    container = client.containers.create(image, argv, network_mode="none")
    try:
        try:
            container.start()
        except docker.errors.APIError as exc:  # argv[0] is not in the image
            return False, str(exc.explanation or exc).strip()
        status = container.wait().get("StatusCode")
        return status == 0, _last_line(container.logs(stdout=True, stderr=True))
    finally:
        container.remove(force=True)


def _last_line(output: bytes) -> str:
    return (output.decode(errors="replace").strip().splitlines() or [""])[-1]


def _start_error(node: str, exc: BaseException) -> BaseException:
    """A start failure in words: GPUs without the NVIDIA toolkit get their fix spelled out."""
    if isinstance(exc, DockerUnavailable) and _NO_GPU_DRIVER in str(exc):
        return RuntimeError_(f"{node}: Docker cannot give containers the GPUs: install the NVIDIA Container "
                             "Toolkit and restart Docker (https://docs.nvidia.com/datacenter/cloud-native/)")
    return exc


def missing_image_message(image: str, node: str) -> str:
    return (f"image {image} is missing on {node}: run `homegpu image build --node {node}` "
            f"or `homegpu image copy {image} --from OTHER`")
