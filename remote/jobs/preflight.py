"""A run's preflight across its nodes, before anything starts, and the port check before each restart.

Each node runs its own checks (remote/jobs/node_checks.py); once every node is ready by itself, reach
(remote/net/reach.py) proves that its peers can connect to its job ports. Each node's result is
published as a PreflightResult, with its GPUs and the memory other processes hold on the job's GPUs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable, Sequence

from homegpu.remote.config import JobSpec
from homegpu.remote.events import PreflightResult
from homegpu.remote.jobs.node_checks import node_preflight, port_problems
from homegpu.remote.net import Endpoint, reach_problems
from homegpu.remote.nodes import (
    NODE_GONE, SHELL_FIX, STUCK_LOGIN_S, Cluster, NodeSession, describe_gpus, foreign_memory_warnings, login_problem,
    talking_shell,
)
from homegpu.remote.plan import DevicePlan, WorkerSlot
from homegpu.remote.runtimes import NEEDS, Runtime, WorkerLaunch, version_mismatch

RuntimeOf = Callable[[WorkerSlot], Runtime]


async def run_preflight(cluster: Cluster, job: JobSpec, run_id: str, slots: Sequence[WorkerSlot],
                        runtime_of: RuntimeOf, launch_for: Callable[[WorkerSlot], WorkerLaunch],
                        local_code: Path, plan: DevicePlan | None) -> list[str]:
    """Check every node of the run and publish each one's PreflightResult.

    Returns:
        Every problem found, one line each naming its node and the fix; none: ready to start.
    """
    first = _first_slots(slots)
    ports = {name: _ports_on(slots, name) for name in first}
    results, logins = await asyncio.gather(
        asyncio.gather(*(node_preflight(runtime_of(slot), launch_for(slot), job, local_code, ports[name])
                         for name, slot in first.items())),
        asyncio.gather(*(login_warnings(cluster.node(name)) for name in first)))
    if job.framework in NEEDS and not any(results):
        versions = {n: runtime_of(s).framework_version for n, s in first.items()}
        results = [found + version_mismatch(NEEDS[job.framework], name, versions)
                   for name, found in zip(first, results)]
    if not any(results):  # each node ready by itself: now prove the network between them
        ends = [Endpoint(cluster.node(name), slot.address, tuple(ports[name])) for name, slot in first.items()]
        found = await reach_problems(ends)
        results = [found_here + [p.text for p in found if p.node == name] for name, found_here in zip(first, results)]
    problems = []
    for name, found, login in zip(first, results, logins):
        stats = cluster.node(name).latest
        gpus = describe_gpus(stats) + (f" ({stats.source})" if stats and stats.gpus else "")
        warnings = foreign_memory_warnings(name, stats, _job_gpus(plan, name), run_id) + _shell_warnings(cluster.node(name))
        warnings += login
        cluster.hub.publish(PreflightResult(job.name, name, tuple(found), gpus, tuple(warnings)))
        problems += found
    return problems


async def restart_port_problems(slots: Sequence[WorkerSlot], runtime_of: RuntimeOf) -> list[str]:
    """The job ports each node cannot bind now (the stopped generation's, say, not yet free)."""
    first = _first_slots(slots)
    found = await asyncio.gather(*(port_problems(runtime_of(slot), slot.address, _ports_on(slots, name))
                                   for name, slot in first.items()), return_exceptions=True)
    return [p for item in found for p in ([str(item)] if isinstance(item, BaseException) else item)]


def _shell_warnings(node: NodeSession) -> list[str]:
    """The node's talking login shell, named with its fix (the run goes on: homegpu sets the text aside)."""
    said = talking_shell(node.shell_banner)
    return [f"{node.name}: {said}. {SHELL_FIX}"] if said else []


async def login_warnings(node: NodeSession) -> list[str]:
    """The node's slow or stuck login shell, named with its file or stale lock and the fix (the run goes on):
    the login its connection paid to start the relay, else one login timed, for at most STUCK_LOGIN_S."""
    try:
        timing = node.last_login or await node.time_login(STUCK_LOGIN_S)
    except NODE_GONE:
        return []  # its checks say so
    problem = login_problem(timing) if timing else None
    return [f"{node.name}: {problem[0]}. {problem[1]}"] if problem else []


def _first_slots(slots: Sequence[WorkerSlot]) -> dict[str, WorkerSlot]:
    """Each node's first worker slot (whose address its workers bind), by node name."""
    return {slot.node.name: slot for slot in reversed(slots)}


def _ports_on(slots: Sequence[WorkerSlot], node: str) -> list[int]:
    return [s.port for s in slots if s.node.name == node]


def _job_gpus(plan: DevicePlan | None, node: str) -> list[int] | None:
    """The GPU indices the device plan gives the job's workers on `node`; None (all) without a plan."""
    if plan is None:
        return None
    return [gpu for worker in plan.workers_on(node) for gpu in worker.gpus]
