"""Per-node checks before a run starts anything: runtime ready, port free, code and data present."""

from __future__ import annotations

import asyncio
from pathlib import Path

from homegpu.remote.config import JobSpec
from homegpu.remote.net import bind_problem, parse_probe, probe_argv
from homegpu.remote.nodes import NODE_GONE
from homegpu.remote.runtimes import NEEDS, Runtime, WorkerLaunch

_PATH_SCRIPT = "import os, sys; print(os.path.exists(os.path.expanduser(sys.argv[1])))"


async def node_preflight(runtime: Runtime, launch: WorkerLaunch, job: JobSpec, local_code: Path,
                         ports: list[int]) -> list[str]:
    """Everything wrong with starting `launch` (and the node's other workers on `ports`)."""
    node = runtime.node
    checks = [runtime.preflight(launch), port_problems(runtime, launch.slot.address, ports)]
    if job.data_dir:
        checks.append(_exists(runtime, job.data_dir, "data_dir", "create it or fix data_dir in the job"))
    if job.framework in NEEDS:
        checks.append(runtime.framework_problems(launch, NEEDS[job.framework]))
    elif job.uses_trainer or job.keras == "tf-keras":  # both need tf-keras on the node
        checks.append(runtime.trainer_problems(launch))
    try:  # each check is a round trip to the node: ask them all at once
        problems = [problem for found in await asyncio.gather(*checks) for problem in found]
    except NODE_GONE as exc:
        return [f"{node.name}: {exc}"]
    if not local_code.is_dir():
        problems.append(f"{node.name}: the job's code directory {local_code} does not exist here")
    return problems


async def port_problems(runtime: Runtime, address: str, ports: list[int]) -> list[str]:
    """What keeps the job's ports on the node from being bound (checked again before each restart)."""
    node = runtime.node
    result = await node.run(probe_argv(node.spec.python, address, ports, every_interface=True), timeout=60)
    return [bind_problem(node.name, bind) for bind in parse_probe(result.stdout) if bind.get("status") != "free"]


async def _exists(runtime: Runtime, path: str, what: str, fix: str) -> list[str]:
    node = runtime.node
    result = await node.run([node.spec.python, "-c", _PATH_SCRIPT, path], timeout=60)
    return [] if result.stdout.strip() == "True" else [f"{node.name}: {what} {path} does not exist; {fix}"]

