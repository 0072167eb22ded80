"""A JAX job on the Docker runtime: node1 runs its process in a container (an engine of its own, the JAX test
image copied there by homegpu's `image copy`), node2 as a plain process: one jax.distributed job across both
runtimes, gloo between their cluster addresses; and an image without JAX refused before anything starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import assert_one_container_exited_ok, homegpu, node1_engine_holding, worker_processes

from simcluster import SimCluster
from test_jax_lan import epoch_losses, jax_job


@pytest.fixture(scope="module")
def node1_engine(sim_cluster: SimCluster, docker_engine, jax_image, tmp_path_factory):
    """node1 with an engine of its own holding the JAX image, copied there by homegpu from node3."""
    with node1_engine_holding(sim_cluster, jax_image, tmp_path_factory.mktemp("copy")) as engine:
        yield engine


def mixed_job(sim_cluster: SimCluster, tmp_path: Path, image: str, docker_node: str = "node1",
              name: str = "jx") -> Path:
    """cluster.toml: the JAX script on `docker_node` (in containers of `image`) and node2 (a process with this
    machine's python, which has the same jax)."""
    overrides = {docker_node: {"runtime": "docker"}, "node2": {"runtime": "process", "python": sys.executable}}
    return jax_job(sim_cluster, tmp_path, name, "jax_data_parallel.py", args=["4"], image=image,
                   nodes=[docker_node, "node2"], python=None, node_overrides=overrides)


def test_a_jax_script_trains_in_a_container_and_a_process_together(sim_cluster, node1_engine, jax_image, jax,
                                                                   tmp_path):
    config = mixed_job(sim_cluster, tmp_path, jax_image)
    result = homegpu("--config", str(config), "run", "jx", "--no-tui", cwd=tmp_path, timeout=600)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    losses = {node: epoch_losses(result.stdout, node) for node in ("node1", "node2")}
    assert sorted(losses["node1"]) == [1, 2, 3, 4] and losses["node1"] == losses["node2"], losses
    assert_one_container_exited_ok(node1_engine, "jx")
    (run_dir,) = (tmp_path / "experiments").iterdir()
    assert (run_dir / "output" / "snapshot.npz").is_file()  # process 0's snapshot, out of its container
    assert not worker_processes(sim_cluster)


def test_an_image_without_jax_is_refused_before_anything_starts(sim_cluster, tf_image, jax, tmp_path):
    """node3 uses this machine's engine, which has the TensorFlow test image: a JAX job naming it is refused in
    preflight with the node, the image, what the import said and the fix."""
    config = mixed_job(sim_cluster, tmp_path, tf_image, docker_node="node3", name="nojax")
    result = homegpu("--config", str(config), "run", "nojax", "--no-tui", cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"node3: JAX (jax.distributed) does not import in image {tf_image} (ModuleNotFoundError: "
            "No module named 'jax'); build the JAX image there (homegpu image build --framework jax "
            "--node node3) or set image in [jobs.nojax]") in result.stderr, result.stderr
    assert not worker_processes(sim_cluster)
    assert not list(sim_cluster.node("node2").work_dir.glob("runs/nojax-*"))
