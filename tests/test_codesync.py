"""Code sync to a real sshd node over SFTP: only what changed travels, and deletions follow."""

from __future__ import annotations

import os
import time

import pytest

from homegpu.remote.cluster import Cluster
from homegpu.remote.codesync import plan_sync, sync_tree
from homegpu.remote.config import load_cluster

pytestmark = pytest.mark.cluster


def test_plan_sync_compares_size_and_mtime():
    local = {"a.py": (10, 100), "b.py": (5, 100), "new.py": (1, 1)}
    remote = {"a.py": (10, 100), "b.py": (5, 99), "gone.py": (3, 3)}
    assert plan_sync(local, remote) == (["b.py", "new.py"], ["gone.py"])


async def test_only_changed_files_travel_and_deletions_follow(sim_cluster, cluster_toml, tmp_path):
    code = tmp_path / "project"
    (code / "pkg").mkdir(parents=True)
    (code / "train.py").write_text("print('v1')\n")
    (code / "pkg" / "model.py").write_text("LAYERS = 2\n")
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0" * 10)
    target = str(sim_cluster.node("node1").work_dir / "code" / "project")

    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node1")
        await node.wait_online(15)
        first = await sync_tree(node, code, target)
        assert sorted(first.uploaded) == ["pkg/model.py", "train.py"]
        assert (sim_cluster.node("node1").work_dir / "code/project/pkg/model.py").read_text() == "LAYERS = 2\n"
        assert not os.path.exists(f"{target}/__pycache__")

        again = await sync_tree(node, code, target)
        assert again.uploaded == () and again.unchanged == 2

        time.sleep(1.1)  # a new mtime second, as an editor's save would give
        (code / "train.py").write_text("print('v2')\n")
        (code / "pkg" / "model.py").unlink()
        edited = await sync_tree(node, code, target)
        assert edited.uploaded == ("train.py",) and edited.removed == ("pkg/model.py",)
    assert open(f"{target}/train.py").read() == "print('v2')\n"
    assert not os.path.exists(f"{target}/pkg/model.py")
