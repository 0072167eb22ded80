"""A PyTorch job on the Docker runtime: node1 runs its worker in a container (an engine of its own, the PyTorch
test image copied there by homegpu's `image copy`), node2 as a plain process: one DDP job across both
runtimes, as a home with a Docker desktop and a laptop with a venv has it, gloo between their addresses."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from helpers import assert_one_container_exited_ok, homegpu, node1_engine_holding, worker_processes

from simcluster import SimCluster, free_job_port
from test_pytorch_lan import DDP_SCRIPT, epoch_losses


@pytest.fixture(scope="module")
def node1_engine(sim_cluster: SimCluster, docker_engine, torch_image, tmp_path_factory):
    """node1 with an engine of its own holding the PyTorch image, copied there by homegpu from node3."""
    with node1_engine_holding(sim_cluster, torch_image, tmp_path_factory.mktemp("copy")) as engine:
        yield engine


def mixed_job(sim_cluster: SimCluster, tmp_path: Path, image: str, docker_node: str = "node1", name: str = "ddp",
              **job) -> Path:
    """cluster.toml: the tutorial's multinode.py on `docker_node` (in containers of `image`) and node2 (a
    process with this machine's python, which has the same torch)."""
    (tmp_path / "ddp").mkdir()
    shutil.copy(DDP_SCRIPT, tmp_path / "ddp" / "multinode.py")
    table = {"image": image, "script": "ddp/multinode.py", "args": ["6", "1"], "nodes": [docker_node, "node2"],
             "port": free_job_port(), "stall_timeout": 180.0, "max_restarts": 1, **job}
    overrides = {docker_node: {"runtime": "docker"}, "node2": {"runtime": "process", "python": sys.executable}}
    return sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", node_overrides=overrides, jobs={name: table})


def test_the_ddp_tutorial_trains_in_a_container_and_a_process_together(sim_cluster, node1_engine, torch_image,
                                                                       pytorch, tmp_path):
    config = mixed_job(sim_cluster, tmp_path, torch_image)
    result = homegpu("--config", str(config), "run", "ddp", "--no-tui", cwd=tmp_path, timeout=600)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node1", "node2"):  # rank 0 in node1's container (the chief), rank 1 in node2's process
        losses = epoch_losses(result.stdout, node)
        assert sorted(losses) == list(range(1, 7)), result.stdout  # its Epoch 0..5
        assert losses[6] < 0.5 * losses[1], f"{node} did not learn: {losses}"
    assert_one_container_exited_ok(node1_engine, "ddp")
    (run_dir,) = (tmp_path / "experiments").iterdir()
    assert (run_dir / "output" / "snapshot.pt").is_file()  # the chief's snapshot, out of its container
    assert not worker_processes(sim_cluster)


def test_an_image_without_torch_is_refused_before_anything_starts(sim_cluster, tf_image, pytorch, tmp_path):
    """node3 uses this machine's engine, which has the TensorFlow test image: a PyTorch job naming it is
    refused in preflight with the node, the image, what the import said and the fix."""
    config = mixed_job(sim_cluster, tmp_path, tf_image, docker_node="node3", name="notorch")
    result = homegpu("--config", str(config), "run", "notorch", "--no-tui", cwd=tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f"node3: PyTorch (torch.distributed) does not import in image {tf_image} (ModuleNotFoundError: "
            "No module named 'torch'); build the PyTorch image there (homegpu image build --framework pytorch "
            "--node node3) or set image in [jobs.notorch]") in result.stderr, result.stderr
    assert not worker_processes(sim_cluster)
    assert not list(sim_cluster.node("node2").work_dir.glob("runs/notorch-*"))
