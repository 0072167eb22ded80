"""Cluster: one NodeSession per node, one event stream, and the commands front ends call."""

from __future__ import annotations

import asyncio
from typing import Iterable

from homegpu.remote.config import ClusterSpec
from homegpu.remote.events import EventHub, NodeState, Subscription
from homegpu.remote.nodes import hostkeys
from homegpu.remote.nodes.connect import OfferedKey, fetch_offered_key
from homegpu.remote.nodes.session import NodeSession


class Cluster:
    """Opens every node in parallel on enter and closes them all on exit.

    Usage::

        async with Cluster(spec) as cluster:
            with cluster.subscribe() as events:
                async for event in events: ...
    """

    def __init__(self, spec: ClusterSpec, *, stream_stats: bool = True, light_first: bool = True) -> None:
        """`light_first`: each node's first stats line leaves GPU health to the next, an interval later, so that a
        screen that keeps updating (the TUI, serve) shows the node without waiting for a slow probe; a one-shot
        reader that shows health (`homegpu status`) asks for it on the first line."""
        self.spec = spec
        self.hub = EventHub()
        self.nodes = {node.name: NodeSession(spec, node, self.hub, stream_stats=stream_stats, light_first=light_first)
                      for node in spec.nodes}
        # the placement's login by an ssh alias of its own: a session for its commands, not one of the nodes shown
        self._login_alias = NodeSession(spec, spec.slurm_login_spec(), EventHub(), stream_stats=False) \
            if spec.login_only and not spec.slurm_login_node() else None

    async def __aenter__(self) -> "Cluster":
        for node in self._sessions():
            node.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await asyncio.gather(*(node.close() for node in self._sessions()))

    def _sessions(self) -> list[NodeSession]:
        return [*self.nodes.values(), *([self._login_alias] if self._login_alias else [])]

    def slurm_login(self) -> NodeSession:
        """The session where Slurm's commands run (`slurm_login`: a node's, or its alias's own)."""
        return self._login_alias or self.node(self.spec.slurm_login)

    def subscribe(self) -> Subscription:
        return self.hub.subscribe()

    def node(self, name: str) -> NodeSession:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in {self.spec.source} "
                           f"(nodes: {', '.join(self.nodes)})") from None

    def addresses(self) -> dict[str, str]:
        """Every node's resolved cluster address (NodeSession.address), by node name."""
        return {name: node.address for name, node in self.nodes.items()}

    def reconnect(self, name: str) -> None:
        self.node(name).reconnect()

    async def wait_settled(self, timeout: float, names: Iterable[str] | None = None) -> None:
        """Wait until each node is online (with its first stats, when streaming them), or has failed
        to connect, or `timeout` passes."""

        def settled(node: NodeSession) -> bool:
            if node.state is NodeState.ONLINE:
                return node.latest is not None or not node.streams_stats
            return node.state is not NodeState.CONNECTING

        async def one(node: NodeSession) -> None:
            try:
                await node.wait_for(settled, timeout)
            except asyncio.TimeoutError:
                pass

        await asyncio.gather(*(one(self.node(n)) for n in (names or self.nodes)))

    async def offered_key(self, name: str) -> OfferedKey:
        """The host key a node offers that known_hosts does not have yet (for `trust`)."""
        return await fetch_offered_key(self.spec, self.node(name).spec)

    async def resolve_addresses(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, str]]:
        """name -> (cluster address, where it comes from), once the nodes are connected or have
        failed to connect; an offline node keeps its configured address or host (and says so)."""
        names = list(names or self.nodes)
        await self.wait_settled(self.spec.ssh.connect_timeout + 2, names)
        return {name: (self.node(name).address, self.node(name).address_source) for name in names}

    def trust(self, name: str, offered: OfferedKey) -> None:
        """Append the offered key to known_hosts and reconnect the node with it."""
        hostkeys.append_trusted(self.spec.ssh.known_hosts, offered.host, offered.port, offered.key)
        self.reconnect(name)
