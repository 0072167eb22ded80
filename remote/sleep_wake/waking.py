"""Waking nodes: the magic packet (node_side/scripts/wake_packet.py), sent from here or from the node's `wake_via`,
then SSH tried until the node answers, within its `wake_timeout`.

A node homegpu put to sleep (nodes/asleep.py) stays "asleep" while it boots; its session is asked to try
again every few seconds instead of its rare sleeping retry, and marks it awake once reached.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Callable, Iterable

from homegpu.remote.events import NodeState
from homegpu.remote.node_side import script, send_wake_packet
from homegpu.remote.nodes import NODE_GONE, Cluster, CommandTimeout, NodeSession, cause

PROBE_SECONDS = 3.0  # how often a booting node's SSH is tried
PROGRESS_SECONDS = 5.0  # how often the wait says how long it has waited
RESEND_SECONDS = 15.0  # a UDP packet may be lost: sent again this often while the node has not answered
SEND_TIMEOUT_S = 20.0  # for a wake_via node to send the packet
WOL_HELP = ("Wake-on-LAN must be on in its BIOS/UEFI and on its NIC (on it, `ethtool NIC | grep Wake-on` should "
            "say g; `sudo ethtool -s NIC wol g` turns it on: docs/sleep.md)")

Progress = Callable[[str], None]
TICK = "waking {node}: {waited:.0f} s of up to {timeout:g} s"  # said every PROGRESS_SECONDS of a wake
_TICK = re.compile(r"^waking \S+: \d+ s of up to \S+ s$")


def is_progress_tick(line: str) -> bool:
    """Whether a progress line only says how long a wake has waited (a log keeps the steps, not each tick)."""
    return bool(_TICK.match(line))


class WakeFailed(Exception):
    """A node could not be woken; the message names it, why, and what to check."""


async def wake(cluster: Cluster, names: Iterable[str], progress: Progress = lambda line: None) -> dict[str, float]:
    """Wake each of `names` at once and wait for its SSH; return the seconds each took (0 for one awake).

    Raises:
        WakeFailed: one line per node that did not wake (the others are awake by then).
    """
    nodes = [cluster.node(name) for name in names]
    results = await asyncio.gather(*(_wake_one(cluster, node, progress) for node in nodes), return_exceptions=True)
    failed = [str(result) for result in results if isinstance(result, WakeFailed)]
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, WakeFailed):
            raise result
    if failed:
        raise WakeFailed("; ".join(failed))
    return {node.name: seconds for node, seconds in zip(nodes, results)}


async def wake_asleep(cluster: Cluster, names: Iterable[str], progress: Progress = lambda line: None) -> dict[str, float]:
    """Wake those of `names` that homegpu put to sleep (the others are left as they are)."""
    asleep = [name for name in names if cluster.node(name).state is NodeState.ASLEEP]
    return await wake(cluster, asleep, progress) if asleep else {}


async def _wake_one(cluster: Cluster, node: NodeSession, progress: Progress) -> float:
    if node.state is NodeState.ONLINE:
        return 0.0
    keys = node.spec.sleep_wake
    if not keys.wakeable:
        raise WakeFailed(f"{node.name} is {node.state.value} and has no mac in cluster.toml, so homegpu cannot "
                         "wake it: add its wired NIC's mac (`ip link` on it shows it)")
    start = time.monotonic()
    sent_from = await _send(cluster, node)
    progress(f"waking {node.name}: magic packet for {keys.mac} sent {sent_from}")
    said = sent = start
    while node.state is not NodeState.ONLINE:
        waited = time.monotonic() - start
        if time.monotonic() - sent >= RESEND_SECONDS:
            await _send(cluster, node)
            sent = time.monotonic()
        if waited >= keys.wake_timeout:
            raise WakeFailed(f"{node.name} did not wake within {keys.wake_timeout:g} s of its magic packet "
                             f"(sent {sent_from}): its mac {keys.mac} must be its wired NIC's (`ip link` on it shows "
                             f"link/ether), and {WOL_HELP}{_reach_hint(node)}")
        if time.monotonic() - said >= PROGRESS_SECONDS:
            progress(TICK.format(node=node.name, waited=waited, timeout=keys.wake_timeout))
            said = time.monotonic()
        node.reconnect()  # try now, not at the sleeping node's rare retry
        try:
            await node.wait_online(min(PROBE_SECONDS, keys.wake_timeout - waited))
        except asyncio.TimeoutError:
            pass
    return time.monotonic() - start


async def _send(cluster: Cluster, node: NodeSession) -> str:
    """Send the node's magic packet; say from where ("from here to ...", "through NODE")."""
    mac, via_name = node.spec.sleep_wake.mac, node.spec.sleep_wake.wake_via
    if not via_name:
        sent, errors = await asyncio.to_thread(send_wake_packet, mac)
        if not sent:
            raise WakeFailed(f"{node.name}: the magic packet could not be sent from here: {'; '.join(errors)}")
        return "from here to " + ", ".join(dict.fromkeys(address.rsplit(":", 1)[0] for address in sent))
    via = cluster.node(via_name)
    try:
        await via.wait_online(SEND_TIMEOUT_S)
        result = await via.run([via.spec.python, "-c", script("wake_packet"), mac], timeout=SEND_TIMEOUT_S)
    except (*NODE_GONE, CommandTimeout, asyncio.TimeoutError) as exc:
        why = cause(exc) if not isinstance(exc, asyncio.TimeoutError) else f"{via.name} is {via.state.value}"
        raise WakeFailed(f"{node.name}: its wake_via node {via.name} could not send the magic packet ({why}); "
                         f"{via.name} must be online") from None
    said = (result.stdout.strip().splitlines() or ["{}"])[-1]
    try:
        answer = json.loads(said)
    except ValueError:
        answer = {"errors": [said or result.stderr.strip()[-200:]]}
    if not answer.get("sent"):
        raise WakeFailed(f"{node.name}: {via.name} could not send the magic packet: {'; '.join(answer.get('errors', []))}")
    return f"through {via.name}"


def _reach_hint(node: NodeSession) -> str:
    if node.spec.sleep_wake.wake_via:
        return f"; and {node.spec.sleep_wake.wake_via} must be on its LAN"
    return ("; and the packet must reach its LAN: a broadcast does not cross a router, VPN or Wi-Fi bridge, "
            "so set wake_via to a node on its LAN if this machine is not")
