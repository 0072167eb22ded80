"""`homegpu wake NODE…` and `homegpu sleep NODE…`: Wake-on-LAN and sleep for the nodes with a `mac`."""

from __future__ import annotations

import argparse
import asyncio
import sys

from homegpu.remote.events import NodeState
from homegpu.remote.nodes import Cluster, connect_wait
from homegpu.remote.sleep_wake import NotIdle, SleepFailed, WakeFailed, put_to_sleep, wake
from homegpu.tui.cli.common import UserError, load_spec

SETTLE_S = 10.0  # how long the nodes get to answer (or be found asleep) before anything is done


def register(commands: argparse._SubParsersAction) -> None:
    waking = commands.add_parser(
        "wake", help="wake sleeping nodes (Wake-on-LAN) and wait until they answer",
        description="Send each NODE's magic packet (its mac in cluster.toml, to every LAN this machine is on, or "
                    "through its wake_via node) and wait for its SSH, up to its wake_timeout. Says how long each "
                    "took to boot. Exit status 1 when one did not wake.")
    waking.add_argument("nodes", metavar="NODE", nargs="+", help="node names from cluster.toml")
    waking.set_defaults(handler=run_wake)
    sleeping = commands.add_parser(
        "sleep", help="put idle nodes to sleep with their sleep_command",
        description="Run each NODE's sleep_command (through `sudo -n` when its SSH user is not root) once it is "
                    "idle: no homegpu worker, no process on its GPUs, nobody logged in. "
                    "A node in use is left alone with the reason. The node then shows as asleep, and "
                    "`homegpu wake`, `homegpu run` and serve's queue wake it when work needs it.")
    sleeping.add_argument("nodes", metavar="NODE", nargs="+", help="node names from cluster.toml")
    sleeping.set_defaults(handler=run_sleep)


def run_wake(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    _known(spec, args.nodes)
    return asyncio.run(_wake(spec, args.nodes))


def run_sleep(args: argparse.Namespace) -> int:
    spec = load_spec(args)
    _known(spec, args.nodes)
    for name in args.nodes:
        if not spec.node(name).sleep_wake.wakeable:
            raise UserError(f"{name} has no mac in {spec.source}: homegpu could not wake it again, so it does not put "
                            "it to sleep; add its wired NIC's mac (`ip link` on it shows it)")
    return asyncio.run(_sleep(spec, args.nodes))


async def _wake(spec, names: list[str]) -> int:
    async with Cluster(spec) as cluster:
        await cluster.wait_settled(timeout=connect_wait(spec, 2), names=names)
        try:
            took = await wake(cluster, names, lambda line: print(line, flush=True))
        except WakeFailed as exc:
            print(f"homegpu: {exc}", file=sys.stderr)
            return 1
    for name, seconds in took.items():
        print(f"{name} is awake" + (f" after {seconds:.0f} s" if seconds else " (it was already)"))
    return 0


async def _sleep(spec, names: list[str]) -> int:
    async with Cluster(spec) as cluster:
        await cluster.wait_settled(timeout=connect_wait(spec, SETTLE_S), names=names)
        results = await asyncio.gather(*(_sleep_one(cluster, name) for name in names))
    return 0 if all(results) else 1


async def _sleep_one(cluster: Cluster, name: str) -> bool:
    node = cluster.node(name)
    if node.state is NodeState.ASLEEP:
        print(f"{name} is asleep already")
        return True
    try:
        await put_to_sleep(cluster, name)
    except (NotIdle, SleepFailed) as exc:
        print(f"homegpu: {exc}", file=sys.stderr)
        return False
    print(f"{name} is asleep: `homegpu wake {name}` (or work that needs it) wakes it")
    return True


def _known(spec, names: list[str]) -> None:
    known = [node.name for node in spec.nodes]
    for name in names:
        if name not in known:
            raise UserError(f"no node {name!r} in {spec.source}; nodes: {', '.join(known)}")
