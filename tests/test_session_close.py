"""Closing a node's session ends its supervisor, even one that went on after a cancel.

Python 3.11's asyncio.wait_for returns the result that came at the moment it was cancelled, swallowing the
cancel: a connection made just as `homegpu status` closed its sessions left the supervisor streaming, and the
command printed its answer and never exited (CI, tests/test_sleep_wake_lan.py, a node that had just woken). The
fake open_transport here swallows the first cancel as wait_for does then, and returns a connection.
"""

from __future__ import annotations

import asyncio

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import EventHub, NodeState
from homegpu.remote.nodes import session as session_module
from homegpu.remote.nodes.session import NodeSession
from homegpu.remote.nodes.transport import LocalTransport


async def test_close_ends_a_supervisor_that_swallowed_the_cancel(tmp_path, monkeypatch):
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "box.lan"\n')
    spec = load_cluster(tmp_path / "cluster.toml")
    connecting = asyncio.Event()
    made: list[LocalTransport] = []

    async def connected_as_it_was_cancelled(cluster, node):
        connecting.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # as wait_for does when its connection completed in the same moment
        made.append(LocalTransport())
        return made[-1]

    monkeypatch.setattr(session_module, "open_transport", connected_as_it_was_cancelled)
    node = NodeSession(spec, spec.nodes[0], EventHub(), stream_stats=False)
    node.start()
    await asyncio.wait_for(connecting.wait(), 5)
    closing = asyncio.create_task(node.close())
    done, _ = await asyncio.wait({closing}, timeout=30)  # a bound for a hang, not a speed: it takes a moment
    if not done:
        node._task.cancel()  # the second cancel ends it, so the test ends
        await asyncio.wait({closing}, timeout=5)
    assert done, "close() waited on a supervisor that had swallowed its cancel"
    assert node._task.done() and node.transport is None
    assert made and made[0]._closed.is_set()  # the connection that came late is closed, not left open
    assert node.state in (NodeState.CONNECTING, NodeState.ONLINE)
