"""NodeSession: keeps one node connected, its stats agent streaming, and says what happens.

Each node runs its own supervisor task, so a dead or slow node never delays another. A lost
connection is noticed by asyncssh's keepalive (interval × count) or at once when the peer resets it,
then retried with capped exponential backoff and jitter. States that retrying cannot fix (host key
unknown or changed, authentication refused) wait for the user: `reconnect()` after `trust`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from homegpu.remote.config import ClusterSpec, NodeSpec
from homegpu.remote.events import (
    EventHub, NodeState, NodeStateChanged, NodeStats, NodeStatsUnavailable, NodeStatsUpdated, NotAvailable,
)
from homegpu.remote.nodes.agent_bundle import agent_command, agent_payload
from homegpu.remote.nodes.asleep import AsleepNodes
from homegpu.remote.nodes.backoff import Backoff
from homegpu.remote.nodes.connect import (
    AuthFailed, HostKeyChanged, HostKeyUnknown, NodeError, address_behind_jump, open_transport,
)
from homegpu.remote.nodes.health import GpuHealth
from homegpu.remote.nodes.login_time import STUCK_LOGIN_S, LoginTiming, login_problem
from homegpu.remote.nodes.reach_probe import PROBE_EVERY_SECONDS, pause_until_reachable, probe_address
from homegpu.remote.nodes.stats import StatsParseError, parse_agent_line
from homegpu.remote.nodes.transport import CommandResult, NodeTransport, RemoteProcess, TransportError
from homegpu.remote.nodes.waiting import wait_condition, wait_set

AGENT_RETRY_SECONDS = 5.0
ASLEEP_RETRY_SECONDS = 60.0  # a node homegpu put to sleep is tried this rarely (a wake asks at once)

_ERROR_STATES = {
    HostKeyUnknown: NodeState.HOST_KEY_UNKNOWN,
    HostKeyChanged: NodeState.HOST_KEY_CHANGED,
    AuthFailed: NodeState.AUTH_FAILED,
}


class NodeOffline(NodeError):
    """A command was asked of a node that is not connected right now."""


# What a caller of run()/spawn() handles when the node is gone, whether or not we noticed yet.
NODE_GONE = (NodeOffline, TransportError)


class NodeSession:
    """One node: its connection, its state and its latest stats."""

    def __init__(self, cluster: ClusterSpec, spec: NodeSpec, hub: EventHub,
                 backoff: Backoff | None = None, stream_stats: bool = True, light_first: bool = True) -> None:
        self.cluster, self.spec, self.hub = cluster, spec, hub
        self.state = NodeState.CONNECTING
        self.reason = ""
        self.fingerprint = ""
        self.reached: str | None = None  # the address the last SSH connection reached
        self._reached_how = ""  # where `reached` came from when not the connection's peer (ProxyJump)
        self.latest: NodeStats | None = None
        self.health = GpuHealth()  # what holds its GPUs back, judged line by line
        self.transport: NodeTransport | None = None
        self._backoff = backoff or Backoff()
        self._asleep = AsleepNodes(cluster)
        self._said_sleeping = False  # what the agent's last line said of logind's "about to sleep"
        self.streams_stats = stream_stats
        self.light_first = light_first  # the agent's first line leaves GPU health to the next (agent_command)
        self._agent_began: float | None = None  # when the stats agent was started, until its first line
        self._wake = asyncio.Event()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def address(self) -> str:
        """The node's cluster address (TF_CONFIG, iperf3): `address` from cluster.toml, else the
        address its SSH connection reached, else (never connected) the configured host."""
        return self.spec.address or self.reached or self.spec.cluster_address

    @property
    def address_source(self) -> str:
        """Where `address` comes from, for status and check."""
        if self.spec.address:
            return "address in cluster.toml"
        if self.spec.is_local:
            return "this machine"
        if self.reached:
            return self._reached_how or f"reached by ssh {self.spec.host}"
        return f"host {self.spec.host}, not resolved: no SSH connection yet"

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"node {self.name}")

    async def close(self) -> None:
        if self._task:
            # Cancelled until it ends: one cancel() can be swallowed. Python 3.11's asyncio.wait_for returns
            # a result that came at the moment it was cancelled (a connection made just then), and the
            # supervisor would go on streaming with nobody left to stop it.
            while not self._task.done():
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._drop_transport()

    def reconnect(self) -> None:
        """Drop the connection (if any) and try again now, without waiting for the backoff."""
        self._wake.set()

    async def wait_for(self, predicate, timeout: float | None = None) -> None:
        """Wait until predicate(self) holds, re-checked on every state or stats change."""
        await wait_condition(self._changed, lambda: predicate(self), timeout)

    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        """Run a command on the node. Raises NodeOffline when it is not connected."""
        return await self._connected().run(argv, input=input, timeout=timeout)

    async def spawn(self, argv: Sequence[str]) -> RemoteProcess:
        """Start a long-running command on the node. Raises NodeOffline when it is not connected."""
        return await self._connected().start(argv)

    async def time_login(self, timeout: float) -> LoginTiming | None:
        """One login of the node's shell, timed (None: commands start without one). Raises NodeOffline."""
        return await self._connected().time_login(timeout)

    @property
    def last_login(self) -> LoginTiming | None:
        """The login this connection paid to start its relay, timed (None: not yet, or commands pay one each)."""
        return getattr(self.transport, "last_login", None)

    @property
    def login_waiting(self) -> float | None:
        """Seconds a login of the connection has been waited for so far, the longer of two: the relay's start, and
        the stats agent's own (started, nothing printed yet: its login shell has not run it); None: not waiting."""
        waits = (getattr(self.transport, "login_waiting", None), self._agent_waiting())
        return max((waited for waited in waits if waited is not None), default=None)

    def _agent_waiting(self) -> float | None:
        return None if self._agent_began is None else time.monotonic() - self._agent_began

    @property
    def waiting_on(self) -> str:
        """Why the node says nothing yet while online: a login not done after STUCK_LOGIN_S, in words ("": none)."""
        waited = self.login_waiting
        if waited is None or waited < STUCK_LOGIN_S:
            return ""
        detail, fix = login_problem(LoginTiming(None, "", waited))
        return f"{detail}. {fix}"

    @property
    def shell_banner(self) -> str:
        """What the node's login shell printed before homegpu's commands so far ("" when silent)."""
        return self.transport.shell_banner if self.transport else ""

    @property
    def sftp_trouble(self) -> str:
        """Why SFTP cannot work on the node, once a file operation found out ("" otherwise)."""
        return self.transport.sftp_trouble if self.transport else ""

    async def home_dir(self) -> str:
        return await self._connected().home_dir()

    async def list_tree(self, remote_dir: str, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
        return await self._connected().list_tree(remote_dir, skip)

    async def makedirs(self, path: str) -> None:
        await self._connected().makedirs(path)

    async def get_tree(self, remote_dir: str, local_dir: Path) -> None:
        await self._connected().get_tree(remote_dir, local_dir)

    async def wait_online(self, timeout: float | None = None) -> None:
        await self.wait_for(lambda node: node.transport is not None, timeout)

    def _connected(self) -> NodeTransport:
        if self.transport is None:
            raise NodeOffline(self.name, f"{self.name} is {self.state.value}: {self.reason}".rstrip(": "))
        return self.transport

    # -- the supervisor ----------------------------------------------------------------------

    async def _supervise(self) -> None:
        while True:
            # A retry on the backoff keeps showing why the last try failed ("offline: connection
            # refused" beats a "connecting" that flickers between tries); the first try and one
            # the user asked for say "connecting".
            if self.state is NodeState.CONNECTING or self._wake.is_set():
                await self._set_state(NodeState.CONNECTING)
            self._wake.clear()
            try:
                transport = await open_transport(self.cluster, self.spec)
            except NodeError as exc:
                state = _ERROR_STATES.get(type(exc), NodeState.OFFLINE)
                if state is NodeState.OFFLINE and await self._note_asleep():
                    await self._pause(ASLEEP_RETRY_SECONDS)
                    continue
                offered = getattr(exc, "offered", None)
                await self._set_state(state, str(exc), offered.fingerprint if offered else "")
                await self._pause(None if state.needs_user else self._backoff.next_delay())
                continue
            self.transport = transport
            await self._learn_address(transport)
            self._backoff.reset()
            self._asleep.clear(self.name)  # reached: awake, however it woke
            self._said_sleeping = False
            await self._set_state(NodeState.ONLINE)
            reason = await self._serve(transport)
            self._drop_transport()
            if not await self._note_asleep():
                await self._set_state(NodeState.OFFLINE, reason)
            await self._pause(self._backoff.next_delay())

    async def _note_asleep(self) -> bool:
        """Say the node is asleep when it is marked so (nodes/asleep.py); whether it is."""
        spell = self._asleep.spell(self.name) if self.spec.sleep_wake.wakeable else None
        if spell is None:
            return False
        await self._set_state(NodeState.ASLEEP, spell.reason())
        return True

    def _note_sleeping(self, stats: NodeStats) -> None:
        """Mark the node asleep when its agent says logind is putting it to sleep, so the connection that drops
        next reads as sleep, not a fault; unmark it when it says so no more (a suspend that was called off, or a
        session that lived through it). Only a node with a `mac`: without one it could not be woken."""
        if not self.spec.sleep_wake.wakeable or stats.sleeping == self._said_sleeping:
            return
        self._said_sleeping = stats.sleeping
        if stats.sleeping:
            if self._asleep.spell(self.name) is None:  # homegpu's own `sleep` marked it already
                self._asleep.mark(self.name, by_itself=True)
        else:
            self._asleep.clear(self.name)

    async def _learn_address(self, transport: NodeTransport) -> None:
        """Where the connection went: its socket's peer, or for a node behind a ProxyJump gateway (no
        peer here) what the other nodes reach it by (asked once, not when cluster.toml sets `address`)."""
        if transport.peer_address or self.spec.is_local or self.spec.address:
            self.reached, self._reached_how = transport.peer_address or self.reached, ""
            return
        found = await address_behind_jump(self.cluster, self.spec, transport)
        if found:
            self.reached, self._reached_how = found

    async def _serve(self, transport: NodeTransport) -> str:
        """Stream stats until the connection ends or a reconnect is asked for; say which."""
        tasks = {asyncio.create_task(transport.wait_closed()), asyncio.create_task(self._wake.wait())}
        if self.streams_stats:
            tasks.add(asyncio.create_task(self._stats_loop(transport)))
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return "reconnect requested" if self._wake.is_set() else "connection lost"

    async def _pause(self, delay: float | None) -> None:
        """Sleep `delay` seconds (None: until reconnect()), cut short by reconnect() or, for a node whose SSH
        port did not answer, by its answering again (reach_probe.py): a machine back is seen within a second
        or two, not at the end of a 30-second backoff."""
        address = probe_address(self.cluster, self.spec) if delay is not None and delay > PROBE_EVERY_SECONDS \
            else None
        if address is None:
            await wait_set(self._wake, delay)
        else:
            await pause_until_reachable(self._wake, delay, address)

    def _drop_transport(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    async def _set_state(self, state: NodeState, reason: str = "", fingerprint: str = "") -> None:
        self.state, self.reason, self.fingerprint = state, reason, fingerprint
        if state is not NodeState.ONLINE:
            self.latest, self.health = None, GpuHealth()  # a reason is not held across a gap
        self.hub.publish(NodeStateChanged(self.name, state, reason, fingerprint))
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- stats ---------------------------------------------------------------------------------

    async def _stats_loop(self, transport: NodeTransport) -> None:
        """Keep one stats agent running on the node; restart it if it dies while we are online."""
        while True:
            reason = await self._run_agent(transport)
            self.hub.publish(NodeStatsUnavailable(self.name, reason))
            await asyncio.sleep(AGENT_RETRY_SECONDS)

    async def _run_agent(self, transport: NodeTransport) -> str:
        # a node's agent starts by a login (this machine's does not): its wait counts in login_waiting
        self._agent_began = None if self.spec.is_local else time.monotonic()
        try:
            return await self._agent_to_end(transport)
        finally:
            self._agent_began = None

    async def _agent_to_end(self, transport: NodeTransport) -> str:
        argv = agent_command(python=self.spec.python, interval=self.cluster.stats_interval,
                             work_dir=self.cluster.work_dir_of(self.spec), light_first=self.light_first)
        # by its own login, beside the relay's: the first line, which the node's first screen waits for, does not
        # wait for the relay's start and a channel to it (the agent lives as long as the connection either way)
        process = await transport.start(argv, by_login=True)
        try:
            process.write(agent_payload())
            async for line in process.lines():
                self._agent_began = None  # it runs: its login is done
                await self._take_stats_line(line)
            stderr = (await process.stderr_text()).strip().splitlines()  # before wait(), which drains it
            status = await process.wait()
        finally:
            await process.close()
        detail = stderr[-1] if stderr else "no output"
        return f"stats agent ({self.spec.python}) exited with status {status}: {detail}"

    def _with_host_power(self, stats: NodeStats) -> NodeStats:
        """Without RAPL, the rest of the machine's draw as the node's idle_watts and busy_watts estimate it."""
        if type(stats.host_energy) is not NotAvailable or type(stats.cpu) is NotAvailable:
            return stats
        watts = self.spec.host_watts(stats.cpu)
        return stats if watts is None else replace(stats, host_power=round(watts, 1))

    async def _take_stats_line(self, line: str) -> None:
        try:
            stats = parse_agent_line(line)
        except StatsParseError:
            return  # a stray line (a shell banner, say) must not stop the stream
        stats = self._with_host_power(stats)
        self._note_sleeping(stats)
        self.latest = stats
        self.health.take(stats)
        self.hub.publish(NodeStatsUpdated(self.name, stats, held_back=self.health.judgement()))
        await self._notify()
