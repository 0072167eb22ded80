"""Log tails on real sshd nodes: bounded buffers, and no gap or duplicate across a lost node."""

from __future__ import annotations

import asyncio
import threading
import time


from helpers import wait_until
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.events import NodeState
from homegpu.remote.logs.tail import LogTail
from homegpu.remote.nodes.cluster import Cluster


class Writer(threading.Thread):
    """Appends numbered lines to a file at a steady pace, like a training job's log."""

    def __init__(self, path, count: int, pause: float) -> None:
        super().__init__(daemon=True)
        self.path, self.count, self.pause = path, count, pause

    def run(self) -> None:
        with open(self.path, "a", buffering=1) as out:
            for number in range(1, self.count + 1):
                out.write(f"line {number}\n")
                time.sleep(self.pause)


async def test_file_tail_survives_a_killed_node_without_gaps_or_duplicates(sim_cluster, cluster_toml):
    sim_node = sim_cluster.node("node1")
    log = sim_node.work_dir / "train.log"
    log.write_text("")
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node1")
        await node.wait_online(timeout=60)
        tail = LogTail.file(node, str(log), max_lines=10_000).start()
        writer = Writer(log, count=120, pause=0.02)
        writer.start()
        assert await wait_until(lambda: tail.count >= 20, timeout=60)
        sim_node.kill()  # connection and tail die mid-stream while the writer goes on
        await node.wait_for(lambda n: n.state is NodeState.OFFLINE, timeout=60)
        sim_node.start()
        cluster.reconnect("node1")
        writer.join()
        assert await wait_until(lambda: tail.count >= 120, timeout=60)
        assert await tail.finish(60)  # and the rest of the file, where a duplicate would be
    assert [line.text for line in tail.lines] == [f"line {n}" for n in range(1, 121)]
    assert [line.seq for line in tail.lines] == list(range(1, 121))


async def test_buffer_is_bounded(sim_cluster, cluster_toml):
    log = sim_cluster.node("node2").work_dir / "flood.log"
    log.write_text("".join(f"flood {n}\n" for n in range(1, 20_001)))
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node2")
        await node.wait_online(timeout=60)
        tail = LogTail.file(node, str(log), max_lines=100).start()
        assert await wait_until(lambda: tail.count == 20_000, timeout=60)
        await tail.stop()
    assert len(tail.lines) == 100
    assert tail.lines[0].text == "flood 19901" and tail.lines[-1].text == "flood 20000"


async def test_command_tail_that_replays_resumes_after_reconnect(sim_cluster, cluster_toml):
    """`tail -n +1 -F` replays the whole file on every start, as `docker logs -f` does."""
    sim_node = sim_cluster.node("node3")
    log = sim_node.work_dir / "replay.log"
    log.write_text("".join(f"old {n}\n" for n in range(1, 6)))
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node3")
        await node.wait_online(timeout=60)
        tail = LogTail.command(node, ["tail", "-n", "+1", "-F", str(log)], label="replay").start()
        assert await wait_until(lambda: tail.count == 5, timeout=60)
        sim_node.kill()
        with open(log, "a") as out:
            out.write("".join(f"new {n}\n" for n in range(1, 4)))
        sim_node.start()
        cluster.reconnect("node3")
        # the file's last line: a duplicate would come before it, in the same replay
        assert await wait_until(lambda: tail.lines and tail.lines[-1].text == "new 3", timeout=60)
        await tail.stop()
    assert [line.text for line in tail.lines] == [f"old {n}" for n in range(1, 6)] + [
        f"new {n}" for n in range(1, 4)]


async def test_finished_command_ends_the_tail_and_keeps_its_last_line(sim_cluster, cluster_toml):
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node1")
        await node.wait_online(timeout=60)
        ends = []
        tail = LogTail.command(node, ["printf", "a\\nb\\nno newline"], on_end=lambda: ends.append(tail.count)).start()
        await asyncio.wait_for(tail.finished.wait(), 60)
        await tail.stop()
    assert [line.text for line in tail.lines] == ["a", "b", "no newline"]
    assert ends == [3]  # told once, after its last line (a container that stopped: the run polls its workers)


async def test_no_follower_is_left_on_the_node_after_stop(sim_cluster, cluster_toml):
    sim_node = sim_cluster.node("node2")
    log = sim_node.work_dir / "quiet.log"
    log.write_text("only line\n")
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node2")
        await node.wait_online(timeout=60)
        tail = LogTail.file(node, str(log)).start()
        assert await wait_until(lambda: tail.count == 1, timeout=60)
        assert await wait_until(lambda: _tails_of(log), timeout=60), "no `tail -F` follows the log on the node"
        await tail.stop()
        # the quiet file gives tail nothing to write, so only the session tie can end it
        assert await wait_until(lambda: not _tails_of(log), timeout=60), f"`tail -F` left running: {_tails_of(log)}"


def _tails_of(path) -> list[int]:
    import os

    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"tail") and str(path).encode() in argv:
                pids.append(int(entry))
    return pids
