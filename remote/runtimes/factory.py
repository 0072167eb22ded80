"""Which runtime a node gets: the one factory, so callers never name a runtime class."""

from __future__ import annotations

from homegpu.remote.nodes import NodeSession
from homegpu.remote.runtimes.base import Runtime
from homegpu.remote.runtimes.docker_runtime import DockerRuntime
from homegpu.remote.runtimes.process_runtime import ProcessRuntime


def make_runtime(node: NodeSession, run_root: str) -> Runtime:
    """The node's runtime from cluster.toml.

    Args:
        run_root: an absolute path on the node (see runtime.expand_path) under which runs live.

    Returns:
        A DockerRuntime for `runtime = "docker"` (with GPUs when the node's stats show some),
        else a ProcessRuntime.
    """
    if node.spec.runtime == "docker":
        return DockerRuntime(node, run_root, gpus=bool(node.latest and node.latest.gpus))
    return ProcessRuntime(node, run_root)
