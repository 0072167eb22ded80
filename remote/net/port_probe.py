"""One probe for TCP ports on a node: bind them as TensorFlow's server (or iperf3) would.

Binding is the only sure test: a port is free when a socket binds it (SO_REUSEADDR: a TIME_WAIT
leftover is no obstacle, a listener is), and binding the node's address proves it is the node's own.
The script runs with the node's python and needs only the standard library. Port 0 asks the node
for any free port. Used by doctor (the job port), preflight (every worker's port) and bandwidth
(a port for the iperf3 server); a job port that does not bind is said in one line by its cause
(`bind_problem`, for preflight and the reach proof).
"""

from __future__ import annotations

import json
from typing import Sequence

from homegpu.remote.node_side import script

PROBE_SCRIPT = script("port_bind")


def probe_argv(python: str, address: str, ports: Sequence[int], every_interface: bool = False) -> list[str]:
    """Returns: the command that probes `ports` on `address` with the node's `python`."""
    return [python, "-c", PROBE_SCRIPT, address, "any" if every_interface else "only", *map(str, ports)]


def parse_probe(stdout: str) -> list[dict]:
    """Returns: one dict per bind tried ({"host", "port", "status", "ip", "error", "strerror"});
    status is "free", "in use", "not local", "denied", "unresolved" or "error". Lines that are
    not such objects (a python that did not run) are left out."""
    return [found for line in stdout.splitlines() if (found := json_object(line)) is not None]


def bind_problem(node: str, bind: dict) -> str:
    """One line for a job port the node cannot bind, by its real cause, with the fix."""
    where, status, why = f"{bind['host']}:{bind['port']}", bind.get("status"), bind.get("strerror", "")
    if status == "in use":
        return f"{node}: job port {where} is in use ({why}); stop what uses it or set another port in the job"
    if status == "unresolved":
        return (f"{node}: its address {bind['host']!r} does not resolve on {node} ({why}); set address = "
                f"\"<its LAN IP>\" for {node} in cluster.toml")
    if status == "not local":
        return (f"{node}: {bind['host']} is not an address of {node} ({why}); set {node}'s address in cluster.toml "
                "to one of its own")
    if status == "denied":
        return f"{node}: job port {where} needs root to bind ({why}); set a port above 1024 in the job"
    return f"{node}: cannot bind job port {where} ({why or status}); set another port in the job"


def json_object(line: str | bytes) -> dict | None:
    """The JSON object a node's script printed on `line`; None for anything else."""
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
