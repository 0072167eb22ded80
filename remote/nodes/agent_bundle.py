"""Send the stats agent to a node through one SSH session, writing nothing on the node.

The node runs ``python3 -c BOOTSTRAP ...``; the controller writes :func:`agent_payload` to its stdin
and then keeps stdin open. The payload is three length-prefixed parts (``b"<n>\\n"`` then n bytes):
the controller's own ``pynvml`` source, so nodes need nothing installed to use NVML, the
``process_owners`` source (who owns each GPU process) and the agent source. The bootstrap makes a
module of the second, runs the agent with the pynvml source and that module in its globals, and the
agent's stdin-EOF watch then covers the rest of stdin: closing the session stops the agent.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

from homegpu.remote.node_side import AGENT_SOURCES, script_bytes

# Python 3.8+ on the node. The agent compiles the shipped pynvml only where the NVML library
# loads; one the node's Python cannot run is dropped, and the agent then falls back to nvidia-smi.
BOOTSTRAP = """\
import sys, types
def part():
    return sys.stdin.buffer.read(int(sys.stdin.buffer.readline()))
nvml = part()
owners = types.ModuleType("process_owners")
exec(compile(part(), "process_owners.py", "exec"), owners.__dict__)
exec(compile(part(), "stats_agent.py", "exec"),
     {"__name__": "__main__", "SHIPPED_PYNVML": nvml, "PROCESS_OWNERS": owners})
"""


def agent_source() -> bytes:
    """The agent script as shipped (it runs on the node, so it is read, never imported here)."""
    return script_bytes("stats_agent")


def owners_source() -> bytes:
    """process_owners.py as shipped next to the agent."""
    return script_bytes("process_owners")


def pynvml_source() -> bytes:
    """The controller's installed ``pynvml`` (nvidia-ml-py is one pure-Python file); b"" if none."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return b""
    return Path(spec.origin).read_bytes()


def _part(data: bytes) -> bytes:
    return b"%d\n" % len(data) + data


@functools.cache  # the same files for the process's life; read once, not once per node and reconnect
def agent_payload() -> bytes:
    """What to write to the bootstrap's stdin first: pynvml, process_owners, the agent, length-prefixed."""
    return _part(pynvml_source()) + _part(owners_source()) + _part(agent_source())


def agent_command(
    python: str = "python3",
    interval: float = 1.0,
    work_dir: str = "~/.homegpu",
    source: str = "auto",
) -> list[str]:
    """The argv that starts the agent on a node; the remote side ``shlex.join``s it.

    ``work_dir`` stays unexpanded: the agent expands ``~`` on the node, for the node's user.

    Raises:
        ValueError: ``interval`` is not positive or ``source`` is not one the agent knows.
    """
    if not interval > 0:
        raise ValueError(f"interval must be positive, got {interval!r}")
    if source not in AGENT_SOURCES:
        raise ValueError(f"source must be one of {', '.join(AGENT_SOURCES)}, got {source!r}")
    return [
        python, "-c", BOOTSTRAP,
        "--interval", f"{interval:g}", "--work-dir", work_dir, "--source", source,
    ]
