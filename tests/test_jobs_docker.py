"""Jobs on the Docker runtime: real sshd nodes, a real Docker engine, a TensorFlow image built here.

The image is built once from Debian packages and PyPI (tests/images.py, FACTS.md recipe) and
reused; every node reaches the engine through its own SSH session's forwarded socket.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from helpers import homegpu

from simcluster import SimCluster, free_job_port
from test_docker import ENGINE2_SOCKET, engine2  # noqa: F401  (a second engine, for a node lacking the image)

pytestmark = [pytest.mark.cluster, pytest.mark.docker]


def docker_job(image: str, **overrides) -> dict:
    table = {"image": image, "nodes": ["node1", "node2"], "epochs": 2, "steps_per_epoch": 20, "batch_size": 32,
             "port": free_job_port(), "stall_timeout": 180.0, "max_restarts": 1}
    table.update(overrides)
    return table


def containers_of(job: str) -> list:
    client = docker.from_env()
    try:
        return client.containers.list(all=True, filters={"label": f"homegpu.job={job}"})
    finally:
        client.close()


def test_demo_job_trains_in_containers_on_two_nodes(sim_cluster: SimCluster, docker_engine, tf_image, tmp_path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker",
                                            jobs={"dockerdemo": docker_job(tf_image)})
    result = homegpu("--config", str(config), "run", "dockerdemo", "--no-tui", cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [m for m in metrics if m.get("event") == "epoch"]
    assert {m["worker_label"] for m in epochs} == {"node1", "node2"}
    assert any((run_dir / "output" / "model").iterdir()), "the chief's model was not fetched"
    containers = containers_of("dockerdemo")
    assert {c.labels["homegpu.node"] for c in containers} == {"node1", "node2"}
    assert all(c.status == "exited" for c in containers), "a container is still running"
    assert all(c.attrs["HostConfig"]["NetworkMode"] == "host" for c in containers)


def test_missing_image_on_one_node_starts_nothing_and_names_it(
        sim_cluster: SimCluster, docker_engine, tf_image, engine2, tmp_path):  # noqa: F811
    config = sim_cluster.write_cluster_toml(
        tmp_path / "cluster.toml", runtime="docker", jobs={"lacking": docker_job(tf_image)},
        node_overrides={"node2": {"docker_socket": ENGINE2_SOCKET}})
    result = homegpu("--config", str(config), "run", "lacking", "--no-tui", cwd=tmp_path, timeout=900)
    assert result.returncode == 1
    assert "node2" in result.stderr and "missing" in result.stderr and "homegpu image" in result.stderr
    assert "node1: " not in result.stderr.split("not started:")[1].split("missing")[0]
    assert containers_of("lacking") == []


def test_killed_homegpu_reattaches_to_containers_without_duplicates(sim_cluster: SimCluster, docker_engine,
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
        running = sorted(c.id for c in containers_of("longdocker") if c.status == "running")
        assert len(running) == 2

        second = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            for line in second.stdout:
                lines.append(line)
                if "epoch" in line and any("attaching" in seen for seen in lines):
                    break
            assert any("already running" in seen for seen in lines), "".join(lines)
            assert sorted(c.id for c in containers_of("longdocker")) == running, "a duplicate container started"
        finally:
            second.kill()
            second.wait()
        stopped = homegpu("--config", str(config), "stop", "longdocker", cwd=tmp_path)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert not [c for c in containers_of("longdocker") if c.status == "running"]
    finally:
        first.kill()
        for container in containers_of("longdocker"):
            container.remove(force=True)
