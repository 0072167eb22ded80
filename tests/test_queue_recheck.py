"""The queue runner's last look before a start (remote/queue/runner.py, step 2): the GPUs are judged again on a
stats sample newer than the one the decision saw, so another user's process that came in between makes the
entry wait, with the reason.

The node is this machine (host = "local": its real stats agent, no LAN needed), and its nvidia-smi is
tests/gpu_replay.py answering with the real H100's recording (there is no GPU here), rereading its process
list at every sample; the stranger is a real process of user nobody, so the agent finds its owner as it would.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpu_replay import FIXTURES, write_apps_with_pids, write_replay_nvidia_smi
from helpers import NOBODY, local_cluster_toml
from homegpu.remote.config import load_cluster
from homegpu.remote.nodes import Cluster
from homegpu.remote.queue import QueueRunner, QueueStore

H100 = FIXTURES / "h100-80gb-hbm3"


@pytest.fixture
def stranger(root):
    """A real process of another Unix user (nobody), to stand in the GPU's process list."""
    process = subprocess.Popen(["sleep", "300"], user=NOBODY, group=NOBODY)
    yield process.pid
    process.kill()
    process.wait()


@pytest.fixture
def gpu_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The cluster file and the process list its replayed GPU reports (empty: the GPU is free)."""
    apps = tmp_path / "apps.csv"
    apps.write_text("")
    bin_dir = write_replay_nvidia_smi(tmp_path / "bin", H100 / "gpus_load.csv", apps, reread=True)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    path = local_cluster_toml(tmp_path, '[jobs.gpu]\nnodes = ["here"]\n', name="recheck", cluster="stats_interval = 1.0")
    return load_cluster(path), apps


async def test_a_process_that_came_after_the_decision_makes_the_entry_wait(gpu_node, stranger, tmp_path: Path):
    spec, apps = gpu_node
    with QueueStore(tmp_path / "queue.sqlite") as store:
        async with Cluster(spec) as cluster:
            node = cluster.node("here")
            await node.wait_for(lambda n: n.latest is not None and n.latest.gpus, timeout=60)
            runner = QueueRunner(cluster, store, tmp_path / "experiments")
            entry = store.submit("gpu", user="root", now=0.0)

            decided = runner._samples(entry)  # what a decision to start sees: the GPU free
            assert not decided["here"].gpus[0].processes
            assert await runner._gpus_taken(entry, decided) == ""  # a newer sample, still free: it may start

            decided = runner._samples(entry)
            write_apps_with_pids(H100 / "apps_load.csv", [stranger], apps)  # nobody's python3 takes 19.6 GiB
            await node.wait_for(lambda n: n.latest.gpus[0].processes, timeout=60)
            reason = await runner._gpus_taken(entry, decided)
            assert reason == "here GPU 0 busy: nobody's python3 holds 19.6 GiB"

            # The whole step before a start: nothing taken while the stranger is there, the reason kept for
            # `homegpu queue`; once its process is gone, the run comes back with the job's lock held.
            assert await runner._ready_run(entry) is None
            assert store.get(entry.id).reason == reason and store.get(entry.id).state.value == "waiting"
            write_apps_with_pids(H100 / "apps_load.csv", [], apps)
            await node.wait_for(lambda n: not n.latest.gpus[0].processes, timeout=60)
            run = await runner._ready_run(entry)
            assert run is not None and run.job.name == "gpu"
            await run.release_lock()
