"""Code sync to real sshd nodes (and the local node): only what changed travels, and the node's
tree ends up a mirror of ours: deletions, renames, modes, empty directories, odd names, files
changed while the sync ran; and a run ships neither its experiments dir nor what is ignored."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import homegpu, job_table
from homegpu.remote.config.cluster_spec import embedded_default, load_cluster
from homegpu.remote.jobs.codesync import SKIP_DIRS, SyncError, plan_sync, settle_racy, sync_tree
from homegpu.remote.nodes.cluster import Cluster

LONG_AGO = time.time() - 3600  # files saved well before the sync: not "racy"
S = 10**9


def test_plan_sync_compares_size_mtime_second_and_mode():
    local = ({"same.py": [10, 100 * S + 5, 0o644], "ns_only.py": [5, 100 * S + 7, 0o644],
              "older.py": [5, 100 * S, 0o644], "exec.sh": [3, 100 * S, 0o755], "new.py": [1, S, 0o644],
              "racy.py": [4, 100 * S, 0o644]},
             ["pkg", "pkg/empty"])
    remote = ({"same.py": [10, 100 * S + 5, 0o644], "ns_only.py": [5, 100 * S + 9, 0o644],
               "older.py": [5, 99 * S, 0o644], "exec.sh": [3, 100 * S, 0o644], "gone.py": [3, S, 0o644],
               "racy.py": [4, 100 * S, 0o644]},
              ["pkg", "old", "old/deep"])
    plan = plan_sync(local, remote, racy=frozenset({"racy.py"}))
    assert plan.upload == ["exec.sh", "new.py", "older.py", "racy.py"]
    assert plan.remove == ["gone.py"]
    assert plan.mkdirs == ["pkg/empty"]
    assert plan.rmdirs == ["old/deep", "old"]  # children before their parent


def test_files_modified_in_the_scan_second_are_stored_a_second_early():
    files = {"old.py": [1, 100 * S, 0o644], "fresh.py": [1, 200 * S + 3, 0o644]}
    assert settle_racy(files, scan_started=200.9) == {"fresh.py"}
    assert files == {"old.py": [1, 100 * S, 0o644], "fresh.py": [1, 199 * S + 3, 0o644]}


def write(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.chmod(path, mode)


def age(root: Path) -> None:
    """Give every file under root an mtime an hour back, as files saved before the sync have."""
    for folder, _, names in os.walk(root):
        for name in names:
            os.utime(Path(folder) / name, (LONG_AGO, LONG_AGO))


def mirror_state(root: Path) -> tuple[dict[str, tuple[bytes, int]], set[str]]:
    """({file: (content, mode bits)}, {directory}) under root, skipped directories left out."""
    files, dirs = {}, set()
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        dirs.update((Path(folder) / d).relative_to(root).as_posix() for d in subdirs)
        for name in names:
            path = Path(folder) / name
            files[path.relative_to(root).as_posix()] = (path.read_bytes(), path.stat().st_mode & 0o777)
    return files, dirs


@pytest.fixture
def project(tmp_path: Path) -> Path:
    code = tmp_path / "project"
    write(code / "train.py", "print('v1')\n")
    write(code / "pkg" / "model.py", "LAYERS = 2\n")
    write(code / "pkg" / "data" / "vocab.json", '{"a": 1}\n')
    write(code / "run.sh", "#!/bin/sh\necho hi\n", 0o755)
    age(code)
    return code


@pytest.fixture
async def node1(sim_cluster, cluster_toml):
    async with Cluster(load_cluster(cluster_toml), stream_stats=False) as cluster:
        node = cluster.node("node1")
        await node.wait_online(60)
        yield node


@pytest.fixture
def target(sim_cluster, request) -> Path:
    """A fresh directory on node1 for this test (the nodes share this machine's filesystem)."""
    return sim_cluster.node("node1").work_dir / "code" / request.node.name


async def test_only_changed_files_travel_and_deletions_follow(node1, project, target):
    write(project / "__pycache__" / "train.cpython-311.pyc", b"\0" * 10)
    first = await sync_tree(node1, project, str(target))
    assert sorted(first.uploaded) == ["pkg/data/vocab.json", "pkg/model.py", "run.sh", "train.py"]
    assert (target / "pkg/model.py").read_text() == "LAYERS = 2\n"
    assert not (target / "__pycache__").exists()
    assert int((target / "train.py").stat().st_mtime) == int(LONG_AGO)

    again = await sync_tree(node1, project, str(target))
    assert again.uploaded == () and again.removed == () and again.unchanged == 4

    write(project / "train.py", "print('v2')\n")
    os.utime(project / "train.py", (LONG_AGO + 5, LONG_AGO + 5))  # the same size, a later save
    (project / "pkg" / "model.py").unlink()
    edited = await sync_tree(node1, project, str(target))
    assert edited.uploaded == ("train.py",) and edited.removed == ("pkg/model.py",)
    assert (target / "train.py").read_text() == "print('v2')\n"
    assert not (target / "pkg/model.py").exists()
    assert mirror_state(target) == mirror_state(project)


async def test_renames_of_files_and_directories(node1, project, target):
    await sync_tree(node1, project, str(target))
    (project / "train.py").rename(project / "main.py")
    (project / "pkg").rename(project / "lib")
    result = await sync_tree(node1, project, str(target))
    assert sorted(result.removed) == ["pkg/data/vocab.json", "pkg/model.py", "train.py"]
    assert sorted(result.uploaded) == ["lib/data/vocab.json", "lib/model.py", "main.py"]
    assert not (target / "pkg").exists()  # the emptied directories go too
    assert mirror_state(target) == mirror_state(project)


async def test_mode_bits_follow_and_a_mode_change_alone_is_sent(node1, project, target):
    await sync_tree(node1, project, str(target))
    assert os.access(target / "run.sh", os.X_OK)
    assert (target / "train.py").stat().st_mode & 0o777 == 0o644
    os.chmod(project / "train.py", 0o750)
    os.chmod(project / "run.sh", 0o600)
    result = await sync_tree(node1, project, str(target))
    assert sorted(result.uploaded) == ["run.sh", "train.py"]
    assert (target / "train.py").stat().st_mode & 0o777 == 0o750
    assert (target / "run.sh").stat().st_mode & 0o777 == 0o600


async def test_empty_nested_directories_and_names_with_spaces_and_unicode(node1, project, target):
    write(project / "notes and plans" / "día 1 ✓.md", "ok\n")
    write(project / "a" / "b" / "c" / "d" / "deep.json", "[]\n")
    (project / "logs" / "empty").mkdir(parents=True)
    age(project)
    await sync_tree(node1, project, str(target))
    assert (target / "notes and plans" / "día 1 ✓.md").read_text() == "ok\n"
    assert (target / "logs" / "empty").is_dir()
    assert mirror_state(target) == mirror_state(project)

    (project / "logs" / "empty").rmdir()
    (project / "notes and plans" / "día 1 ✓.md").unlink()
    (project / "notes and plans").rmdir()
    await sync_tree(node1, project, str(target))
    assert not (target / "logs" / "empty").exists() and not (target / "notes and plans").exists()
    assert mirror_state(target) == mirror_state(project)


async def test_a_file_replaced_by_a_directory_and_back(node1, project, target):
    await sync_tree(node1, project, str(target))
    (project / "train.py").unlink()
    write(project / "train.py" / "inner.py", "x = 1\n")
    await sync_tree(node1, project, str(target))
    assert (target / "train.py" / "inner.py").read_text() == "x = 1\n"

    (project / "train.py" / "inner.py").unlink()
    (project / "train.py").rmdir()
    write(project / "train.py", "print('file again')\n")
    await sync_tree(node1, project, str(target))
    assert (target / "train.py").read_text() == "print('file again')\n"
    assert mirror_state(target) == mirror_state(project)


async def test_skipped_directories_are_neither_sent_nor_removed(node1, project, target):
    for skipped in (".git/HEAD", ".venv/bin/python", "pkg/__pycache__/model.cpython-311.pyc"):
        write(project / skipped, "local only\n")
    result = await sync_tree(node1, project, str(target))
    assert not any(part in SKIP_DIRS for rel in result.uploaded for part in rel.split("/"))
    assert not (target / ".git").exists() and not (target / ".venv").exists()
    write(target / "pkg" / "__pycache__" / "model.cpython-311.pyc", "compiled on the node\n")
    again = await sync_tree(node1, project, str(target))
    assert again.removed == () and again.uploaded == ()
    assert (target / "pkg" / "__pycache__" / "model.cpython-311.pyc").read_text() == "compiled on the node\n"


async def test_a_change_in_the_second_of_the_sync_is_sent_again(node1, project, target):
    """Same size, same mtime second as what the sync read: only the racy rule catches it."""
    write(project / "train.py", "print('A')\n")
    first = await sync_tree(node1, project, str(target))
    assert "train.py" in first.uploaded
    stamp = (project / "train.py").stat().st_mtime_ns
    write(project / "train.py", "print('B')\n")
    os.utime(project / "train.py", ns=(stamp, stamp))
    second = await sync_tree(node1, project, str(target))
    assert "train.py" in second.uploaded
    assert (target / "train.py").read_text() == "print('B')\n"


async def test_a_file_changed_during_the_sync_is_fixed_by_the_next(node1, project, target):
    big = project / "weights.bin"
    write(big, os.urandom(8 << 20))
    writes, stop = [0], threading.Event()

    def keep_rewriting() -> None:
        sizes = (8 << 20, 3 << 20)
        while not stop.is_set():
            big.write_bytes(os.urandom(sizes[writes[0] % 2]))
            writes[0] += 1
            time.sleep(0.01)

    writer = threading.Thread(target=keep_rewriting)
    writer.start()
    try:
        while writes[0] < 2:
            time.sleep(0.01)
        await sync_tree(node1, project, str(target))  # must not fail whatever it read
        done = writes[0]
        while writes[0] < done + 2:
            time.sleep(0.01)
    finally:
        stop.set()
        writer.join()
    fix = await sync_tree(node1, project, str(target))
    assert "weights.bin" in fix.uploaded
    assert (target / "weights.bin").read_bytes() == big.read_bytes()
    assert mirror_state(target) == mirror_state(project)


async def test_the_nodes_python_comes_from_its_spec(sim_cluster, project, tmp_path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml",
                                            node_overrides={"node2": {"python": "/opt/no-such/python3"}})
    async with Cluster(load_cluster(config), stream_stats=False) as cluster:
        node = cluster.node("node2")
        await node.wait_online(60)
        with pytest.raises(SyncError) as failure:
            await sync_tree(node, project, str(sim_cluster.node("node2").work_dir / "code" / "bad-python"))
    message = str(failure.value)
    assert "node2" in message and "/opt/no-such/python3" in message and "\n" not in message


async def test_the_local_node_syncs_through_a_subprocess(project, tmp_path):
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)
        assert node.spec.python == sys.executable
        first = await sync_tree(node, project, str(tmp_path / "mirror"))
        again = await sync_tree(node, project, str(tmp_path / "mirror"))
    assert len(first.uploaded) == 4 and again.uploaded == ()
    assert mirror_state(tmp_path / "mirror") == mirror_state(project)


async def test_a_target_the_node_cannot_create_fails_in_one_line(node1, project, target):
    write(target.parent / "a-file", "not a directory\n")
    with pytest.raises(SyncError) as failure:
        await sync_tree(node1, project, str(target.parent / "a-file" / "code"))
    message = str(failure.value)
    assert message.startswith("node1: code sync to ") and "a-file/code" in message
    assert "Not a directory" in message and "\n" not in message


TRAIN_AND_SAVE = """\
with open("model.bin", "wb") as out:  # in the output dir: the chief's comes home to experiments/RUN-ID/output/
    out.write(b"weights" * 1000)
print("trained")
"""
SHIPPED_LINE = re.compile(r"code sync: 4 files, 6\.0 MB to node1, node2 \(largest: data/ 6\.0 MB\); "
                          r"add a \.homegpuignore to leave some out")


def test_a_script_beside_cluster_toml_ships_neither_the_runs_records_nor_what_is_ignored(sim_cluster, tmp_path):
    """The layout a newcomer makes: main.py beside cluster.toml makes the project folder the code dir, and
    ./experiments is in it. Two runs, the first leaving its record and its model there: nothing of
    experiments/ reaches a node (the second run's own timeline, written while it ships, included), nor
    the folder .homegpuignore names, and each run says what it ships."""
    write(tmp_path / "main.py", TRAIN_AND_SAVE)
    write(tmp_path / "data" / "weights.bin", bytes(6_000_000))
    write(tmp_path / "scratch" / "notes.txt", "not for the nodes\n")
    write(tmp_path / ".homegpuignore", "scratch/\n")
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"beside": job_table(script="main.py")})
    for run in (1, 2):
        result = homegpu("--config", str(config), "run", "beside", "--no-tui", cwd=tmp_path, timeout=300)
        text = result.stdout + result.stderr
        print(text)  # what a user saw (pytest -s)
        assert result.returncode == 0, text
        assert SHIPPED_LINE.search(result.stdout), text
        models = sorted((tmp_path / "experiments").glob("beside-*/output/model.bin"))
        assert len(models) == run, models  # the first run's model is in experiments/ when the second ships
    for name in ("node1", "node2"):
        code = sim_cluster.node(name).work_dir / "code" / "beside"
        assert not (code / "experiments").exists() and not (code / "scratch").exists(), sorted(code.rglob("*"))
        files, _ = mirror_state(code)
        assert sorted(files) == [".homegpuignore", "cluster.toml", "data/weights.bin", "main.py"]
