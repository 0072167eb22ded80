"""Cluster.wait_settled, which every one-shot command (status, doctor, a run's placing) waits on before it reads
the nodes: a node is settled once its line has GPU health, not on an agent's light first line that leaves it to the
next (`health_pending`). No connection here: the session is put online and fed the agent's lines by hand."""

from __future__ import annotations

import asyncio
import json

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import NodeState
from homegpu.remote.nodes import Cluster

GPU = {"index": 0, "name": "NVIDIA H100 NVL", "uuid": "GPU-1"}


def line(**keys) -> str:
    return json.dumps({"v": 1, "t": 1.5, "source": "nvml", "gpus": [GPU], **keys})


async def test_a_node_is_settled_by_the_line_after_its_light_first_one(tmp_path) -> None:
    (tmp_path / "cluster.toml").write_text('[[nodes]]\nname = "box"\nhost = "box.lan"\n')
    cluster = Cluster(load_cluster(tmp_path / "cluster.toml"))  # not entered: no session connects
    node = cluster.node("box")
    node.state = NodeState.ONLINE
    settling = asyncio.create_task(cluster.wait_settled(timeout=60))
    await node._take_stats_line(line(health_pending=True))
    for _ in range(20):  # every turn the waiter needs to see the line, and more
        await asyncio.sleep(0)
    assert node.latest.health_pending and not settling.done()
    await node._take_stats_line(line())
    await asyncio.wait_for(settling, 30)  # a bound for a hang: it returns at once
    assert not node.latest.health_pending
