"""Putting an idle node to sleep: its `sleep_command` (through `sudo -n` for a user who is not root), once
nothing would be cut short, and marked asleep (nodes/asleep.py) so every homegpu process says so.

Idle means: online; no homegpu worker running there; no process of anyone on its GPUs; nobody logged in
(`who`); and, for a sleep nobody asked for (serve's), its CPUs mostly idle. A suspend takes the SSH
connection with it, so a command that never answers is the expected end; one that answers with a failure
leaves the node awake and says why.
"""

from __future__ import annotations

import asyncio

from homegpu.remote.events import NodeState
from homegpu.remote.nodes import NODE_GONE, AsleepNodes, Cluster, CommandTimeout, NodeSession, cause
from homegpu.remote.runtimes import RuntimeError_, expand_path, make_runtime

BUSY_CPU_PERCENT = 50.0  # a node busier than this is doing someone's work
COMMAND_TIMEOUT_S = 15.0  # for `who`, `id -u` and the workers' list
GONE_TIMEOUT_S = 30.0  # for the node to drop off once its sleep command said it would sleep
SUDO_HELP = ("let its SSH user run the command without a password: a sudoers line such as "
             "`USER ALL=(root) NOPASSWD: /usr/bin/systemctl suspend` (docs/sleep.md)")


class NotIdle(Exception):
    """The node is in use; the message says by what. Nothing was done."""


class SleepFailed(Exception):
    """The sleep command failed or the node stayed up; the message says why. The node is awake."""


async def idle_problems(cluster: Cluster, node: NodeSession, cpu: bool = False) -> list[str]:
    """What keeps `node` from sleeping now, each a few words ([] when it is idle); with `cpu`, busy CPUs too."""
    if node.state is not NodeState.ONLINE:
        return [f"it is {node.state.value}"]
    problems = _gpu_users(node) + (_busy_cpu(node) if cpu else [])
    checks = await asyncio.gather(_workers(cluster, node), _logged_in(node), return_exceptions=True)
    for found in checks:
        problems += [f"cannot tell whether it is idle ({cause(found)})"] if isinstance(found, BaseException) else found
    return problems


async def put_to_sleep(cluster: Cluster, name: str, cpu: bool = False) -> None:
    """Run `name`'s sleep command once it is idle (`cpu`: its CPUs too), and see it go.

    Raises:
        NotIdle: what keeps it up (nothing was run).
        SleepFailed: the command failed, or the node was still up GONE_TIMEOUT_S after it.
    """
    node = cluster.node(name)
    problems = await idle_problems(cluster, node, cpu)
    if problems:
        raise NotIdle(f"{name} is not idle: {'; '.join(problems)}; nothing was done")
    argv = node.spec.sleep_wake.sleep_argv(as_root=await _is_root(node))
    asleep = AsleepNodes(cluster.spec)
    asleep.mark(name)  # before the connection drops, so the node's session says "asleep", not "offline"
    try:
        result = await node.run(argv, timeout=COMMAND_TIMEOUT_S)
    except (*NODE_GONE, CommandTimeout):
        result = None  # the suspend took the connection with it
    if result is not None and result.exit_status < 0:
        result = None  # no exit status: the connection went before the command could end
    if result is not None and not result.ok:
        asleep.clear(name)
        said = result.telling_line
        help_ = f"; {SUDO_HELP.replace('USER', node.spec.user or 'USER')}" if argv[0] == "sudo" else ""
        raise SleepFailed(f"{name}: `{' '.join(argv)}` failed: {said}{help_}")
    try:
        await node.wait_for(lambda n: n.state is not NodeState.ONLINE, GONE_TIMEOUT_S)
    except asyncio.TimeoutError:
        asleep.clear(name)
        raise SleepFailed(f"{name} was still up {GONE_TIMEOUT_S:g} s after `{' '.join(argv)}`") from None


def _gpu_users(node: NodeSession) -> list[str]:
    stats = node.latest
    return [f"GPU {gpu.index} has {len(gpu.processes)} process{'es' if len(gpu.processes) != 1 else ''} "
            f"({', '.join(sorted({p.name for p in gpu.processes if p.name}))[:80] or 'unnamed'})"
            for gpu in (stats.gpus if stats else ()) if gpu.processes]


def _busy_cpu(node: NodeSession) -> list[str]:
    cpu = node.latest.cpu if node.latest else None
    busy = isinstance(cpu, (int, float)) and cpu > BUSY_CPU_PERCENT
    return [f"its CPUs are {cpu:.0f} % busy"] if busy else []


async def _workers(cluster: Cluster, node: NodeSession) -> list[str]:
    try:
        work = await expand_path(node, cluster.spec.work_dir_of(node.spec))
        workers = await make_runtime(node, f"{work}/runs").list_workers()
    except RuntimeError_ as exc:
        return [f"cannot list its homegpu workers ({exc})"]
    running = sorted({f"{w.job} ({w.run_id})" for w in workers if w.running})
    return [f"homegpu runs {', '.join(running)} there"] if running else []


async def _logged_in(node: NodeSession) -> list[str]:
    result = await node.run(["who"], timeout=COMMAND_TIMEOUT_S)
    people = sorted({line.split()[0] for line in result.stdout.splitlines() if line.strip()})
    return [f"{', '.join(people)} logged in"] if people else []


async def _is_root(node: NodeSession) -> bool:
    result = await node.run(["id", "-u"], timeout=COMMAND_TIMEOUT_S)
    return result.stdout.strip() == "0"
