"""Jobs on the Docker runtime: real sshd nodes, each with a Docker engine of its own, and a TensorFlow
image built here.

The image is built once in this machine's engine from Debian packages and PyPI (tests/images.py,
FACTS.md recipe). node1 and node2 get engines of their own (tests/simdocker.py) for this module,
and homegpu's own `image copy` brings the image there from node3, which uses this machine's engine:
about a minute for 2.4 GB into both. Containers then run on the nodes' own addresses with the same
job port on both, and mount the nodes' own work dirs; every node reaches its engine through its
own SSH session's forwarded socket.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import docker.errors
import pytest
from helpers import homegpu, job_table

from simcluster import SimCluster
from simdocker import NodeEngine, image_id, own_engines

JOB_NODES = ("node1", "node2")



def docker_job(image: str, **overrides) -> dict:
    """job_table's job in containers of `image` (no `python`: that is for process nodes), more patient."""
    table = job_table(image=image, stall_timeout=180.0, max_restarts=1, **overrides)
    del table["python"]
    return table


@pytest.fixture(scope="module")
def engines(sim_cluster: SimCluster, docker_engine, tf_image, tmp_path_factory) -> dict[str, NodeEngine]:
    """node1 and node2 with engines of their own holding the TensorFlow image, copied by homegpu."""
    with own_engines(sim_cluster, JOB_NODES) as engines:
        # written now: nodes with engines of their own are written as any node (their own address)
        toml = sim_cluster.write_cluster_toml(tmp_path_factory.mktemp("engines") / "cluster.toml", runtime="docker")
        copy = homegpu("--config", str(toml), "image", "copy", tf_image, "--from", "node3", "--to", "node1",
                       "--to", "node2", timeout=900)
        assert copy.returncode == 0, copy.stdout + copy.stderr
        yield engines


def containers_of(engines: dict[str, NodeEngine], job: str) -> list:
    """The job's containers on every node's own engine."""
    found = []
    for engine in engines.values():
        client = engine.client()
        try:
            found += client.containers.list(all=True, filters={"label": f"homegpu.job={job}"})
        finally:
            client.close()
    return found


def test_demo_job_trains_in_containers_on_two_nodes(sim_cluster: SimCluster, engines, tf_image, tmp_path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                            jobs={"dockerdemo": docker_job(tf_image)})
    result = homegpu("--config", str(config), "run", "dockerdemo", "--no-tui", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [m for m in metrics if m.get("event") == "epoch"]
    assert {m["worker_label"] for m in epochs} == {"node1", "node2"}
    assert any((run_dir / "output" / "model").iterdir()), "the chief's model was not fetched"
    containers = containers_of(engines, "dockerdemo")
    assert {c.labels["homegpu.node"] for c in containers} == {"node1", "node2"}
    assert all(c.status == "exited" for c in containers), "a container is still running"
    assert all(c.attrs["HostConfig"]["NetworkMode"] == "host" for c in containers)


def test_missing_image_on_one_node_starts_nothing_and_names_it(
        sim_cluster: SimCluster, engines, busybox_image, tmp_path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                            jobs={"lacking": docker_job(busybox_image)})
    for name in JOB_NODES:  # node1's engine has the image, node2's has not
        client = engines[name].client()
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(busybox_image, force=True)
        client.close()
    copy = homegpu("--config", str(config), "image", "copy", busybox_image, "--from", "node3", "--to", "node1")
    assert copy.returncode == 0, copy.stdout + copy.stderr
    assert image_id(engines["node2"].socket_path, busybox_image) is None
    result = homegpu("--config", str(config), "run", "lacking", "--no-tui", cwd=tmp_path, timeout=900)
    assert result.returncode == 1
    assert "node2" in result.stderr and "missing" in result.stderr and "homegpu image" in result.stderr
    assert "node1: " not in result.stderr.split("not started:")[1].split("missing")[0]
    assert containers_of(engines, "lacking") == []


def test_killed_homegpu_reattaches_to_containers_without_duplicates(sim_cluster: SimCluster, engines,
                                                                      tf_image, tmp_path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                            jobs={"longdocker": docker_job(tf_image, epochs=50, steps_per_epoch=30)})
    argv = [shutil.which("homegpu", path=str(Path(sys.executable).parent)), "--config", str(config), "run",
            "longdocker", "--no-tui"]
    first = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:
            if "epoch 1/50" in line:
                break
        first.kill()  # homegpu dies; the containers live on
        first.wait()
        running = sorted(c.id for c in containers_of(engines, "longdocker") if c.status == "running")
        assert len(running) == 2

        second = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in second.stdout:
                lines.append(line)
                if "epoch" in line and any("attaching" in seen for seen in lines):
                    break
            assert any("already running" in seen for seen in lines), "".join(lines)
            assert sorted(c.id for c in containers_of(engines, "longdocker")) == running, "a duplicate container started"
        finally:
            second.kill()
            second.wait()
        stopped = homegpu("--config", str(config), "stop", "longdocker", cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not [c for c in containers_of(engines, "longdocker") if c.status == "running"]
    finally:
        first.kill()
        for container in containers_of(engines, "longdocker"):
            container.remove(force=True)


def test_a_keras_io_script_trains_unchanged_in_containers(sim_cluster: SimCluster, engines, tf_image, tmp_path):
    """`import keras` trains across two containers only through trainer/user_script.py (Keras 3 cannot):
    the bootstrap runs in the image's Python from the read-only code mount, as on the process runtime."""
    (tmp_path / "my_model").mkdir()
    shutil.copy(Path(__file__).parent / "fixtures" / "scripts" / "keras_io_mwms.py", tmp_path / "my_model" / "train.py")
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker", jobs={
        "kerasio": docker_job(tf_image, script="my_model/train.py", keras="tf-keras", args=["3"])})
    result = homegpu("--config", str(config), "run", "kerasio", "--no-tui", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Number of devices: 2" in result.stdout and "generation 2" not in result.stdout, result.stdout
    (run_dir,) = (tmp_path / "experiments").iterdir()
    epochs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {(m["worker_label"], m["epoch"]) for m in epochs if m.get("event") == "epoch"} == {
        (w, e) for w in ("node1", "node2") for e in (1, 2, 3)}
