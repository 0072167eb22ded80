"""One probe for TCP ports on a node: bind them as TensorFlow's server (or iperf3) would.

Binding is the only sure test: a port is free when a socket binds it (SO_REUSEADDR: a TIME_WAIT
leftover is no obstacle, a listener is), and binding the node's address proves it is the node's own.
The script runs with the node's python and needs only the standard library. Port 0 asks the node
for any free port. Used by doctor (the job port), preflight (every worker's port) and bandwidth
(a port for the iperf3 server).
"""

from __future__ import annotations

import json
from typing import Sequence

# argv: ADDRESS any|only PORT...; prints one JSON object per bind. With `any`, a port free on
# ADDRESS is also bound on every interface of its family (TensorFlow's server binds them all).
PROBE_SCRIPT = r"""
import errno, json, socket, sys
CODES = {errno.EADDRINUSE: "in use", errno.EADDRNOTAVAIL: "not local", errno.EACCES: "denied"}
def bind(host, port, family=0):
    out = {"host": host or "*", "port": port, "status": "error", "ip": "", "error": "", "strerror": ""}
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host or None, port, family, socket.SOCK_STREAM, 0,
                                                          socket.AI_PASSIVE)[0]
        out["ip"] = addr[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            out.update(status="free", port=sock.getsockname()[1])
        finally:
            sock.close()
    except socket.gaierror as exc:
        out.update(status="unresolved", error=str(exc), strerror=exc.strerror or str(exc))
    except OSError as exc:
        out.update(status=CODES.get(exc.errno, "error"), error=str(exc), strerror=exc.strerror or str(exc))
    return out, family
address, every = sys.argv[1], sys.argv[2] == "any"
for port in sys.argv[3:]:
    out, family = bind(address, int(port))
    print(json.dumps(out))
    if every and out["status"] == "free":
        print(json.dumps(bind("", int(port), family)[0]))
"""


def probe_argv(python: str, address: str, ports: Sequence[int], every_interface: bool = False) -> list[str]:
    """Returns: the command that probes `ports` on `address` with the node's `python`."""
    return [python, "-c", PROBE_SCRIPT, address, "any" if every_interface else "only", *map(str, ports)]


def parse_probe(stdout: str) -> list[dict]:
    """Returns: one dict per bind tried ({"host", "port", "status", "ip", "error", "strerror"});
    status is "free", "in use", "not local", "denied", "unresolved" or "error". Lines that are
    not such objects (a python that did not run) are left out."""
    return [found for line in stdout.splitlines() if (found := json_object(line)) is not None]


def json_object(line: str | bytes) -> dict | None:
    """The JSON object a node's script printed on `line`; None for anything else."""
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None
