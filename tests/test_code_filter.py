"""What code sync ships from a code dir (remote/jobs/code_filter.py, codesync.read_tree): never homegpu's
own output, not what `.homegpuignore` (else `.gitignore`) leaves out, and what it leaves out is left
alone on the nodes; and the line that says what it ships. The last test syncs to the local node."""

from __future__ import annotations

from pathlib import Path

import pytest

from homegpu.remote.config import embedded_default
from homegpu.remote.jobs.code_filter import CodeFilter, own_folders
from homegpu.remote.jobs.codesync import LocalTree, plan_sync, read_tree, shipping_line, sync_tree
from homegpu.remote.nodes import Cluster

MB = 1_000_000


def write(path: Path, data: str | bytes = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project folder as a newcomer makes it, homegpu run from it: main.py beside cluster.toml, and
    the record of an earlier run (with its model) in ./experiments."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "main.py", "print('train')\n")
    write(tmp_path / "cluster.toml", "[cluster]\n")
    write(tmp_path / "lib" / "model.py", "LAYERS = 2\n")
    write(tmp_path / "experiments" / "k3-1" / "output" / "model.keras", b"\0" * 1000)
    write(tmp_path / "experiments" / "k3-2" / ".timeline.sqlite-wal", b"\0" * 10)
    write(tmp_path / "__pycache__" / "main.cpython-311.pyc")
    return tmp_path


async def shipped(root: Path, experiments: Path | None = Path("experiments")) -> set[str]:
    return set((await read_tree(root, CodeFilter(root, experiments))).files)


async def test_the_runs_experiments_dir_is_never_shipped(project):
    assert await shipped(project) == {"main.py", "cluster.toml", "lib/model.py"}


async def test_an_experiments_dir_given_elsewhere_inside_the_code_is_left_out_too(project):
    write(project / "runs" / "r-1" / "timeline.sqlite")
    assert "experiments/k3-1/output/model.keras" in await shipped(project, project / "runs")
    assert not any(rel.startswith("runs/") for rel in await shipped(project, project / "runs"))


def test_only_homegpus_folders_inside_the_code_dir_count(project, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(project / ".cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(project.parent / "elsewhere"))
    assert own_folders(project, Path("experiments")) == ["experiments", ".cache/homegpu"]
    assert own_folders(project / "lib", Path("experiments")) == []  # the experiments dir is not inside lib/
    assert own_folders(project / "experiments", Path("experiments")) == []  # nor inside itself


async def test_homegpus_history_and_bandwidth_files_are_left_out_where_they_lie_inside(project, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(project / "state" / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(project / "state" / "data"))
    write(project / "state" / "cache" / "homegpu" / "bandwidth-home-1234.json", "{}")
    write(project / "state" / "data" / "homegpu" / "history-home-1234.sqlite-wal")
    write(project / "state" / "data" / "notes.txt")  # not homegpu's
    assert await shipped(project) == {"main.py", "cluster.toml", "lib/model.py", "state/data/notes.txt"}


async def test_gitignore_files_are_honoured_at_every_depth(project):
    write(project / ".gitignore", "data/\n*.ckpt\n")
    write(project / "lib" / ".gitignore", "/generated.py\n!keep.ckpt\n")
    for rel in ("data/train.npz", "w.ckpt", "lib/generated.py", "lib/keep.ckpt", "lib/sub/generated.py"):
        write(project / rel)
    assert await shipped(project) == {"main.py", "cluster.toml", "lib/model.py", ".gitignore", "lib/.gitignore",
                                      "lib/keep.ckpt", "lib/sub/generated.py"}


async def test_a_homegpuignore_at_the_top_is_read_instead_of_every_gitignore(project):
    write(project / ".gitignore", "lib/\n")
    write(project / "lib" / ".gitignore", "model.py\n")
    write(project / ".homegpuignore", "cluster.toml\n")
    write(project / "lib" / ".homegpuignore", "model.py\n")  # the top's alone counts
    assert await shipped(project) == {"main.py", "lib/model.py", ".gitignore", "lib/.gitignore", ".homegpuignore",
                                      "lib/.homegpuignore"}


def test_what_is_left_out_is_left_alone_on_the_node(project):
    write(project / ".homegpuignore", "data/\n")
    leaves_out = CodeFilter(project, Path("experiments"))
    tree = LocalTree(project, {"main.py": [3, 0, 0o644]}, [], leaves_out=leaves_out)
    on_node = ({"main.py": [3, 0, 0o644], "gone.py": [1, 0, 0o644], "data/train.npz": [9, 0, 0o644],
                "experiments/k3-0/output/model.keras": [5, 0, 0o644]},
               ["experiments", "experiments/k3-0", "experiments/k3-0/output", "data", "old"])
    plan = plan_sync((tree.files, tree.dirs), tree.node_tree(*on_node))
    assert plan.remove == ["gone.py"] and plan.rmdirs == ["old"]
    assert plan.upload == [] and plan.mkdirs == []


def tree_of(sizes: dict[str, int]) -> LocalTree:
    return LocalTree(Path("/p"), {rel: [size, 0, 0o644] for rel, size in sizes.items()}, [])


@pytest.mark.parametrize("sizes, line", [
    ({"main.py": 1200}, "code sync: 1 file, 1.2 kB to node1, node2"),
    ({"main.py": 100, "lib/a.py": 200, "lib/b/c.py": 300}, "code sync: 3 files, 600 B to node1, node2"),
    ({"main.py": 2000, "data/a.npz": 40 * MB, "data/b/c.npz": 1 * MB, "checkpoints/1.ckpt": 6_100_000,
      "tiny/x": 10},
     "code sync: 5 files, 47.1 MB to node1, node2 (largest: data/ 41.0 MB, checkpoints/ 6.1 MB); "
     "add a .homegpuignore to leave some out"),
    ({f"f{i}.bin": 100_000 for i in range(200)},  # no entry holds 1%: the largest is still named
     "code sync: 200 files, 20.0 MB to node1, node2 (largest: f0.bin 100.0 kB); add a .homegpuignore to leave "
     "some out"),
])
def test_the_line_that_says_what_is_shipped(sizes, line):
    assert shipping_line(tree_of(sizes), ["node1", "node2"]) == line


async def test_a_sync_to_the_local_node_ships_none_of_it_and_removes_nothing_left_out(project, tmp_path):
    write(project / ".homegpuignore", "scratch/\n")
    write(project / "scratch" / "big.bin", b"\0" * 100)
    mirror = tmp_path.parent / f"{tmp_path.name}-mirror"
    write(mirror / "scratch" / "mine.txt", "put there by hand\n")  # left out here: left alone there
    async with Cluster(embedded_default(), stream_stats=False) as cluster:
        node = cluster.node("local")
        await node.wait_online(60)
        result = await sync_tree(node, await read_tree(project, CodeFilter(project, Path("experiments"))),
                                 str(mirror))
    assert sorted(result.uploaded) == [".homegpuignore", "cluster.toml", "lib/model.py", "main.py"]
    assert not (mirror / "experiments").exists() and not (mirror / "scratch" / "big.bin").exists()
    assert (mirror / "scratch" / "mine.txt").read_text() == "put there by hand\n"
