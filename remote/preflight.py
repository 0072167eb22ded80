"""Per-node checks before a run starts anything: runtime ready, port free, code and data present."""

from __future__ import annotations

import asyncio
from pathlib import Path

from homegpu.remote.job_config import JobSpec
from homegpu.remote.node import NODE_GONE
from homegpu.remote.runtime import Runtime, WorkerLaunch

# Binding is the only sure test. TensorFlow's server binds every interface, so the port must be
# free on all of them; the node's own address must also be bindable (or TF_CONFIG points nowhere).
_PORT_SCRIPT = r"""
import socket, sys
address = sys.argv[1]
family = socket.AF_INET6 if ":" in address else socket.AF_INET
for port in sys.argv[2:]:
    for host in (address, ""):
        s = socket.socket(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as exc:
            print("%s:%s %s" % (host or "*", port, exc.strerror))
            break
        finally:
            s.close()
"""

_PATH_SCRIPT = "import os, sys; print(os.path.exists(os.path.expanduser(sys.argv[1])))"


async def node_preflight(runtime: Runtime, launch: WorkerLaunch, job: JobSpec, local_code: Path,
                         ports: list[int]) -> list[str]:
    """Everything wrong with starting `launch` (and the node's other workers on `ports`)."""
    node = runtime.node
    checks = [runtime.preflight(launch), _ports(runtime, launch.slot.node.cluster_address, ports)]
    if job.data_dir:
        checks.append(_exists(runtime, job.data_dir, "data_dir", "create it or fix data_dir in the job"))
    if job.uses_trainer:
        checks.append(runtime.trainer_problems(launch))
    try:  # each check is a round trip to the node: ask them all at once
        problems = [problem for found in await asyncio.gather(*checks) for problem in found]
    except NODE_GONE as exc:
        return [f"{node.name}: {exc}"]
    if not local_code.is_dir():
        problems.append(f"{node.name}: the job's code directory {local_code} does not exist here")
    return problems


async def _ports(runtime: Runtime, address: str, ports: list[int]) -> list[str]:
    node = runtime.node
    result = await node.run([node.spec.python, "-c", _PORT_SCRIPT, address, *map(str, ports)], timeout=60)
    return [f"{node.name}: job port {line} — stop what uses it or set another port in the job"
            for line in result.stdout.splitlines() if line.strip()]


async def _exists(runtime: Runtime, path: str, what: str, fix: str) -> list[str]:
    node = runtime.node
    result = await node.run([node.spec.python, "-c", _PATH_SCRIPT, path], timeout=60)
    return [] if result.stdout.strip() == "True" else [f"{node.name}: {what} {path} does not exist; {fix}"]

