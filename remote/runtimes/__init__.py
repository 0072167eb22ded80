"""homegpu.remote.runtimes: how a worker runs on a node: the runtime contract, detached processes and
Docker containers over the node's forwarded socket, and the one factory that picks between them.
"""

from __future__ import annotations

from homegpu.remote.runtimes.base import STOP_GRACE_SECONDS, NodePaths, Runtime, WorkerLaunch, WorkerStatus, expand_path
from homegpu.remote.runtimes.docker_link import DockerLink, DockerUnavailable, docker_client
from homegpu.remote.runtimes.errors import RuntimeError_
from homegpu.remote.runtimes.factory import make_runtime
from homegpu.remote.runtimes.framework_needs import NEEDS, FrameworkNeeds, version_mismatch

__all__ = [
    "NEEDS", "STOP_GRACE_SECONDS", "DockerLink", "DockerUnavailable", "FrameworkNeeds", "NodePaths", "Runtime",
    "RuntimeError_", "WorkerLaunch",
    "WorkerStatus", "docker_client", "expand_path", "make_runtime", "version_mismatch",
]
