"""cluster.toml edited while serve runs (issue 31, finding 3; remote/queue/cluster_file.py): serve reads it again,
says so in one line, takes new and changed jobs at once, refuses a file that no longer validates or that
changed beyond its jobs while going on with the one it has, and runs no job from a definition the file no
longer has. The files are real cluster.toml files edited on disk; the queue's node is this machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import local_cluster_toml, wait_until
from homegpu.remote.config import load_cluster
from homegpu.remote.nodes import Cluster
from homegpu.remote.queue import EntryState, QueueDesk, QueueError, QueueRunner, QueueStore
from homegpu.remote.queue.cluster_file import ClusterFile

JOB = """
[jobs.{name}]
nodes = ["here"]
python = "{python}"
script = "hold.py"
max_restarts = 0
"""


def write(path: Path, *jobs: str, node: str = "") -> Path:
    local_cluster_toml(path.parent, "".join(JOB.format(name=j, python=sys.executable) for j in jobs), name="edited",
                       node=node)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # an edit, whatever the clock
    return path


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The project: cluster.toml beside its script, in a folder of their own (the code a run ships)."""
    code = tmp_path / "project"
    code.mkdir()
    (code / "hold.py").write_text("import sys, time\ntime.sleep(float(sys.argv[1]) if sys.argv[1:] else 0)\n")
    return write(code / "cluster.toml", "train", "gone")


def test_an_edit_of_the_jobs_is_taken_and_said_in_one_line(config: Path):
    said: list[str] = []
    watched = ClusterFile(load_cluster(config), said.append)
    assert watched.check() is watched.spec and said == []  # unchanged: nothing read, nothing said
    write(config, "train", "newjob")
    spec = watched.check()
    assert sorted(spec.jobs) == ["newjob", "train"] and watched.refusal == ""
    assert said == [f"read {config} again: jobs gone: gone; new: newjob"]


def test_a_file_that_no_longer_validates_is_refused_and_the_old_one_kept(config: Path):
    said: list[str] = []
    watched = ClusterFile(load_cluster(config), said.append)
    config.write_text(config.read_text().replace('script = "hold.py"', 'script = 5', 1))
    assert sorted(watched.check().jobs) == ["gone", "train"]
    assert watched.refusal.startswith(f"{config} changed and no longer validates ({config}:") and \
        watched.refusal.endswith("serve goes on with the file as it read it, and takes no submit until it is fixed")
    assert said == [watched.refusal]
    watched.check()
    assert len(said) == 1  # said once
    write(config, "train")
    assert sorted(watched.check().jobs) == ["train"] and watched.refusal == ""


def test_a_change_beyond_the_jobs_asks_for_a_restart(config: Path):
    said: list[str] = []
    watched = ClusterFile(load_cluster(config), said.append)
    write(config, "train", "gone", node="port = 2300")
    assert watched.check() is watched.spec and "restart serve to use it" in watched.refusal
    assert said == [watched.refusal]


def test_submit_sees_the_file_as_it_is_now(config: Path, tmp_path: Path):
    with QueueStore(tmp_path / "queue.sqlite") as store:
        desk = QueueDesk(load_cluster(config), store)
        write(config, "train", "newjob")
        assert desk.submit("newjob", [], 0, [], "root").job == "newjob"
        with pytest.raises(QueueError, match=f"no job 'gone' in {config} \\(its jobs: newjob, train\\)"):
            desk.submit("gone", [], 0, [], "root")
        config.write_text("[cluster\n")
        with pytest.raises(QueueError, match="changed and no longer validates"):
            desk.submit("train", [], 0, [], "root")


async def test_no_job_runs_from_a_definition_the_file_no_longer_has(config: Path, tmp_path: Path):
    """Two entries of `gone` wait behind a running `train`; the job is deleted from the file: both are
    cancelled with that reason, and none of their runs starts."""
    with QueueStore(tmp_path / "queue.sqlite") as store:
        first = store.submit("train", overrides=["args=['5']"], user="root", now=0.0)
        waiting = [store.submit("gone", after=[first.id], user="root", now=0.0) for _ in range(2)]
        async with Cluster(load_cluster(config)) as cluster:
            await cluster.node("here").wait_online(60)
            said: list[str] = []
            runner = QueueRunner(cluster, store, tmp_path / "experiments", tick=0.2, say=said.append).start()
            try:
                await wait_until(lambda: store.get(first.id).state is EntryState.RUNNING, 120, "train running")
                write(config, "train")
                for entry in waiting:
                    await wait_until(lambda: store.get(entry.id).state is EntryState.CANCELLED, 60, f"{entry.id} cancelled")
                    assert store.get(entry.id).reason == f"job gone is no longer in {config}"
                    assert store.get(entry.id).run_id == ""
                assert said == [f"read {config} again: jobs gone: gone"]
                await wait_until(lambda: store.get(first.id).state is EntryState.SUCCEEDED, 120, "train's end")
            finally:
                await runner.close()
