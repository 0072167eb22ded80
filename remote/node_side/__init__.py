"""homegpu.remote.node_side: the scripts that run on the nodes, shipped as source over SSH: the stats agent
and its modules (`agent/`), and the one-shot scripts (`scripts/`).

Each is standard library only (Python 3.8 or newer) and imports nothing from homegpu, so a node needs
no homegpu install; the controller reads them with `script()`, by plain name, wherever they live. The
stats agent runs with modules of its own (`AGENT_MODULES`), shipped with it by nodes/agent_bundle.py:
how they import each other is in agent/stats_agent.py's docstring. A one-shot script is shipped alone,
as `python -c`, so it imports nothing but the standard library. Each folder's `__init__.py` has its rules.
"""

from __future__ import annotations

import functools
from importlib import resources

from homegpu.remote.node_side.agent.gpu_health import THROTTLE_REASONS
from homegpu.remote.node_side.agent.process_owners import (
    LABEL_BUDGET, LABEL_INDEX, LABEL_JOB, LABEL_RUN, MARKER_BUDGET, MARKER_INDEX, MARKER_JOB, MARKER_RUN,
)
from homegpu.remote.node_side.agent.stats_agent import (
    GPU_SOURCES, MODULES as AGENT_MODULES, PROTOCOL_VERSION, SOURCES as AGENT_SOURCES,
)
from homegpu.remote.node_side.scripts.tree_sync import scan
from homegpu.remote.node_side.scripts.wake_packet import send as send_wake_packet

__all__ = [
    "AGENT_MODULES", "AGENT_SOURCES", "GPU_SOURCES", "LABEL_BUDGET", "LABEL_INDEX", "LABEL_JOB", "LABEL_RUN",
    "MARKER_BUDGET", "MARKER_INDEX", "MARKER_JOB", "MARKER_RUN", "PROTOCOL_VERSION", "SCRIPT_FOLDERS",
    "THROTTLE_REASONS", "scan", "script", "script_bytes", "send_wake_packet",
]

SCRIPT_FOLDERS = ("agent", "scripts")  # where a node script's name is looked for; a name is in one of them


@functools.cache  # the same files for the process's life: read once, not per node and reconnect
def script_bytes(name: str) -> bytes:
    """The source of node_side/agent/NAME.py or node_side/scripts/NAME.py as shipped to a node (read,
    never imported for the node).

    Raises:
        FileNotFoundError: no folder of `SCRIPT_FOLDERS` holds NAME.py.
    """
    for folder in SCRIPT_FOLDERS:
        source = resources.files(f"{__name__}.{folder}").joinpath(f"{name}.py")
        if source.is_file():
            return source.read_bytes()
    raise FileNotFoundError(f"no node script {name}.py in node_side/{' or node_side/'.join(SCRIPT_FOLDERS)}")


def script(name: str) -> str:
    """The source of node_side/agent/NAME.py or node_side/scripts/NAME.py as text, for `python -c`."""
    return script_bytes(name).decode()
