"""NodeSession.login_waiting counts the stats agent's own login: the agent of a node starts by a login of its
own, beside the command relay's, and until it prints its first line that login may be stuck (a stale pyenv
lock), which `homegpu status` and a run's start must say (waiting_on) though the relay's login never began.
No connection here: the fake transport's agent prints only when the test says so. On the LAN:
tests/test_slow_login.py."""

from __future__ import annotations

import asyncio
import json

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import EventHub
from homegpu.remote.nodes import session as session_module
from homegpu.remote.nodes.session import NodeSession
from homegpu.remote.nodes.transport import LocalTransport, RemoteProcess

LINE = json.dumps({"v": 1, "t": 1.5, "source": "none", "gpus": []}) + "\n"


class HeldAgent(RemoteProcess):
    """An agent whose login shell has not run it yet: stdout says nothing until `output` is given something."""

    def __init__(self) -> None:
        self.output: asyncio.Queue[bytes] = asyncio.Queue()

    def write(self, data: bytes) -> None:
        pass

    async def drain(self) -> None:
        pass

    def close_stdin(self) -> None:
        pass

    async def read_chunk(self) -> bytes:
        return await self.output.get()

    async def stderr_text(self) -> str:
        return ""

    async def wait(self) -> int | None:
        return 0

    def terminate(self) -> None:
        pass


async def test_the_agents_own_login_is_waited_for_until_its_first_line(tmp_path, monkeypatch):
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "box.lan"\n')
    spec = load_cluster(tmp_path / "cluster.toml")
    agent, started = HeldAgent(), asyncio.Event()

    class Transport(LocalTransport):  # no relay, so no relay's login: only the agent's own is waited for
        peer_address = "192.0.2.1"  # as an SSH connection's: nothing asked to learn the node's address

        async def start(self, argv, **how) -> RemoteProcess:
            started.set()
            return agent

    async def connect(cluster, node):
        return Transport()

    monkeypatch.setattr(session_module, "open_transport", connect)
    node = NodeSession(spec, spec.nodes[0], EventHub())
    node.start()
    try:
        await asyncio.wait_for(started.wait(), 30)  # a bound for a hang
        assert node.login_waiting is not None and node.login_waiting >= 0
        agent.output.put_nowait(LINE.encode())
        await node.wait_for(lambda session: session.latest is not None, 30)
        assert node.login_waiting is None  # it runs: its login is done
    finally:
        await node.close()
