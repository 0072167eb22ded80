"""A cheap look between retries: does the node's SSH port answer again?

The backoff between connection attempts grows to 30 s, so a machine back from a reboot or a Wi-Fi drop
could sit offline for half a minute, and a run could end before it was ever seen again. Between tries,
while the port is closed or silent, a bare TCP connect each second (no SSH, no login, no key) notices the
moment it opens, and the retry happens then. Edge-triggered: a port that already answers when the wait
starts (sshd up, but the login or the agent failing) is left to the backoff, so a fault that a retry
cannot fix does not become a tight loop. Not for a node behind a ProxyJump gateway, whose port this
machine cannot reach directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from homegpu.remote.config import ClusterSpec, NodeSpec
from homegpu.remote.nodes.connect import ssh_target
from homegpu.remote.nodes.waiting import wait_set

PROBE_EVERY_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 1.0


def probe_address(cluster: ClusterSpec, node: NodeSpec) -> tuple[str, int] | None:
    """The host and port a probe of `node` connects to, or None where no probe can tell (this machine, a
    node behind a gateway, an ssh config that cannot be read)."""
    if node.is_local:
        return None
    target = ssh_target(cluster, node)
    if target.jump or target.problem:
        return None
    return target.host, target.port


async def port_answers(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """Whether a TCP connection to host:port is accepted within `timeout` (it is closed at once)."""
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def pause_until_reachable(wake: asyncio.Event, seconds: float, address: tuple[str, int]) -> None:
    """Wait `seconds`, cut short by `wake` or by the port at `address` answering after it did not."""
    deadline = time.monotonic() + seconds
    if await port_answers(*address):  # answering already: nothing to notice, the backoff runs its course
        await wait_set(wake, max(0.0, deadline - time.monotonic()))
        return
    while (left := deadline - time.monotonic()) > 0:
        if await wait_set(wake, min(left, PROBE_EVERY_SECONDS)):
            return
        if await port_answers(*address):
            return
