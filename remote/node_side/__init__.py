"""homegpu.remote.node_side: the scripts that run on the nodes, shipped as source over SSH.

Each is standard library only (Python 3.8 or newer) and imports nothing from homegpu, so a node needs
no homegpu install; the controller reads them with `script()`. The stats agent runs with modules of
its own (`AGENT_MODULES`), shipped with it: how they import each other is in stats_agent.py's docstring.
"""

from __future__ import annotations

import functools
from importlib import resources

from homegpu.remote.node_side.gpu_health import THROTTLE_REASONS
from homegpu.remote.node_side.process_owners import (
    LABEL_INDEX, LABEL_JOB, LABEL_RUN, MARKER_INDEX, MARKER_JOB, MARKER_RUN,
)
from homegpu.remote.node_side.stats_agent import (
    GPU_SOURCES, MODULES as AGENT_MODULES, PROTOCOL_VERSION, SOURCES as AGENT_SOURCES,
)
from homegpu.remote.node_side.tree_sync import scan
from homegpu.remote.node_side.wake_packet import send as send_wake_packet

__all__ = [
    "AGENT_MODULES", "AGENT_SOURCES", "GPU_SOURCES", "LABEL_INDEX", "LABEL_JOB", "LABEL_RUN", "MARKER_INDEX",
    "MARKER_JOB", "MARKER_RUN", "PROTOCOL_VERSION", "THROTTLE_REASONS", "scan", "script", "script_bytes",
    "send_wake_packet",
]


@functools.cache  # the same files for the process's life: read once, not per node and reconnect
def script_bytes(name: str) -> bytes:
    """The source of node_side/NAME.py as shipped to a node (read, never imported for the node)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_bytes()


def script(name: str) -> str:
    """The source of node_side/NAME.py as text, for `python -c`."""
    return script_bytes(name).decode()
