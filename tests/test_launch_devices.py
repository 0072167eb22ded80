"""Workers get the GPUs the device plan gives them: real sshd nodes, node3 with a replaying nvidia-smi.

node3's nvidia-smi prints output recorded on a real 2 × H100 NVL machine (tests/fixtures/gpu), so
its stats agent reports two GPUs and the device plan lays out one worker per GPU. The workers are
real processes started by `homegpu run`; they print the environment the plan gave them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_replay import FIXTURES, nvidia_smi_in
from helpers import homegpu, worker_processes
import simnet
from simcluster import SimCluster, free_job_port


SHOW_DEVICES = """\
import os
print("devices", os.environ["CUDA_VISIBLE_DEVICES"], os.environ["HOMEGPU_COLLECTIVE"], flush=True)
"""


@pytest.fixture
def two_gpu_node3(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    """node3 answers nvidia-smi with a 2-GPU recording for the test; what was there is put back."""
    with nvidia_smi_in(sim_cluster.node("node3").extra_path, FIXTURES / "gpus_2x_h100nvl_idle.csv",
                       FIXTURES / "apps_none.csv"):
        yield sim_cluster


def write_job(sim: SimCluster, tmp_path: Path, **job) -> Path:
    """cluster.toml with job "show" on node1 (no GPU) and node3 (two), running SHOW_DEVICES."""
    (tmp_path / "show").mkdir(exist_ok=True)
    (tmp_path / "show" / "show.py").write_text(SHOW_DEVICES)
    table = {"python": sys.executable, "script": "show/show.py", "nodes": ["node1", "node3"],
             "port": free_job_port(), **job}
    return sim.write_cluster_toml(tmp_path / "cluster.toml", jobs={"show": table})


def test_per_gpu_workers_see_exactly_their_gpu_and_the_collective(two_gpu_node3, tmp_path):
    config = write_job(two_gpu_node3, tmp_path, workers_per_node="per-gpu")
    result = homegpu("--config", str(config), "run", "show", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    seen = {line.split("|")[0].strip(): line.split("devices", 1)[1].split()
            for line in result.stdout.splitlines() if "| devices " in line}
    # node3's two workers each see one GPU; node1 has none, so RING is the collective for all.
    assert seen == {"node1": ["-1", "RING"], "node3": ["0", "RING"], "node3#1": ["1", "RING"]}, result.stdout
    assert not worker_processes(two_gpu_node3)
    # `homegpu logs` (a fresh homegpu) lays the job out from the nodes' GPUs too: node3#1 is found.
    logs = homegpu("--config", str(config), "logs", "show", cwd=tmp_path)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "node3#1 | devices 1 RING" in logs.stdout, logs.stdout


def test_mismatched_replicas_refuse_the_launch_in_one_line_before_anything_starts(two_gpu_node3, tmp_path):
    config = write_job(two_gpu_node3, tmp_path, workers_per_node=1)  # node3's worker: 2 GPUs, node1's: CPU
    result = homegpu("--config", str(config), "run", "show", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 1, result.stdout + result.stderr
    refusal = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(refusal) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "job show: node node3: its workers would have 2 replicas (GPUs 0,1 H100 NVL)" in refusal[0]
    assert 'set workers_per_node = "per-gpu"' in refusal[0]
    assert "preflight" not in result.stdout  # refused before preflight: nothing ran on the nodes
    assert not worker_processes(two_gpu_node3)
    assert not list((tmp_path / "experiments").glob("*/logs/*"))


def test_tfconfig_shows_the_plan_and_offline_only_addresses(two_gpu_node3, tmp_path):
    config = write_job(two_gpu_node3, tmp_path, workers_per_node="per-gpu")
    result = homegpu("--config", str(config), "tfconfig", "show", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines if line.startswith("worker ")]
    port = int(rows[0][3].rsplit(":", 1)[1])
    node1, node3 = simnet.address_of(2), simnet.address_of(4)
    assert rows == [["worker", "0", "node1", f"{node1}:{port}", "CPU"],
                    ["worker", "1", "node3", f"{node3}:{port}", "GPU", "0", "H100", "NVL"],
                    ["worker", "2", "node3#1", f"{node3}:{port + 1}", "GPU", "1", "H100", "NVL"]], result.stdout
    assert "collective RING (a worker runs on CPU)" in lines
    assert not any(line.startswith("batch ") for line in lines)  # batch_size is the built-in trainer's, not a script's
    assert any(line.startswith("node1 (CPU) would run at about") and 'leave it out with nodes = ["node3"]' in line
               for line in lines), result.stdout
    assert sum("TF_CONFIG=" in line for line in lines) == 3
    offline = homegpu("--config", str(config), "tfconfig", "show", "--offline", cwd=tmp_path)
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert "(cluster.toml)" in offline.stdout and "devices not asked (--offline)" in offline.stdout
    assert not any(line.startswith("worker ") for line in offline.stdout.splitlines())
