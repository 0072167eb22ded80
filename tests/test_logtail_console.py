"""A followed log shows what a terminal would, and a finished worker's log is read to its last byte.

Real sshd nodes: a progress bar redrawn with carriage returns, a line of megabytes with no newline,
and a log that ends without one, followed over SSH the way a worker's log is.
"""

from __future__ import annotations

import asyncio


from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.logs.tail import LogTail
from homegpu.remote.nodes.cluster import Cluster


def progress_epoch(epoch: int, steps: int = 40) -> str:
    """What Keras writes for one epoch at verbose=1: a bar redrawn after each step, then a newline."""
    redraws = "".join(f"\r{step}/{steps} [{'=' * step}{'.' * (steps - step)}] - loss: {1 / step:.4f}"
                      for step in range(1, steps + 1))
    return f"Epoch {epoch}/3\n{redraws}\n"


async def test_a_progress_bar_becomes_one_line_per_epoch(sim_cluster, cluster_toml):
    log = sim_cluster.node("node1").work_dir / "keras.log"
    log.write_text("".join(progress_epoch(epoch) for epoch in (1, 2, 3)))
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node1")
        await node.wait_online(timeout=60)
        tail = LogTail.file(node, str(log), follow=False).start()
        await asyncio.wait_for(tail.finished.wait(), 60)
    texts = [line.text for line in tail.lines]
    assert texts[:2] == ["Epoch 1/3", f"40/40 [{'=' * 40}] - loss: 0.0250"]
    assert len(texts) == 6 and max(map(len, texts)) < 100


async def test_finish_reads_a_huge_line_and_the_unfinished_last_one(sim_cluster, cluster_toml):
    log = sim_cluster.node("node2").work_dir / "flood.log"
    with open(log, "w") as out:
        out.write("x" * 5_000_000)  # 5 MB without a newline, then many short lines
        out.write("".join(f"\nline {n}" for n in range(1, 50_001)))  # the last has no newline
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node2")
        await node.wait_online(timeout=60)
        tail = LogTail.file(node, str(log), max_lines=100).start()
        complete = await tail.finish(timeout=60)
    assert complete
    assert tail.count == 50_001  # the huge line (cut, with its marker) and every short one
    assert tail.lines[-1].text == "line 50000"
