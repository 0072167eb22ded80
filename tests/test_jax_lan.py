"""JAX jobs on two machines of the test LAN with real JAX (CPU, gloo between them): a script written for a cluster,
calling `jax.distributed.initialize()` with no arguments, a Keras 3 script on the JAX backend with
keras.distribution, a process killed mid-run, and the demo `init --framework jax` writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
from pathlib import Path

from helpers import homegpu, run_and_strike, run_init_demo, wait_for, worker_processes

from simcluster import free_job_port
from test_pytorch_lan import recorded_epochs
from test_queue_lan import serving, submit, wait_state

SCRIPTS = Path(__file__).parent / "fixtures" / "scripts"
# `run --no-tui` shows the script's `[process 0] Epoch 2 | Steps: 20 | Loss 0.9138` (0-based) as epoch 3
NODE_EPOCH = re.compile(r"^(node\d) \* epoch (\d+)/\?\s+loss ([0-9.]+)", re.MULTILINE)


def jax_job(sim_cluster, tmp_path: Path, name: str, script: str, node_overrides: dict | None = None, **job) -> Path:
    """cluster.toml with job `name`: `script` (from tests/fixtures/scripts) in jax/, on node1 and node2, its
    framework read from its imports; a key given as None is left out."""
    (tmp_path / "jax").mkdir()
    shutil.copy(SCRIPTS / script, tmp_path / "jax" / script)
    table = {"python": sys.executable, "script": f"jax/{script}", "nodes": ["node1", "node2"],
             "port": free_job_port(), "stall_timeout": 120.0, "max_restarts": 1, **job}
    table = {key: value for key, value in table.items() if value is not None}
    return sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", node_overrides=node_overrides or {},
                                          jobs={name: table})


def epoch_losses(output: str, node: str) -> dict[int, float]:
    return {int(epoch): float(loss) for found, epoch, loss in NODE_EPOCH.findall(output) if found == node}


def test_tfconfig_shows_each_process_what_jax_distributed_needs(sim_cluster, tmp_path):
    config = jax_job(sim_cluster, tmp_path, "jx", "jax_data_parallel.py", args=["3"])
    result = homegpu("--config", str(config), "tfconfig", "jx")
    assert result.returncode == 0, result.stdout + result.stderr
    chief = f"{sim_cluster.node('node1').address}:"
    assert "jax.distributed: 2 processes, the coordinator on process 0; collectives gloo (every process runs on " \
           "CPU)" in result.stdout, result.stdout
    assert re.search(rf"JAX_COORDINATOR_ADDRESS={re.escape(chief)}\d+ HOMEGPU_JAX_PROCESS_COUNT=2 "
                     r"HOMEGPU_JAX_PROCESS_ID=1 python jax/jax_data_parallel.py 3", result.stdout), result.stdout
    assert "TF_CONFIG" not in result.stdout


def test_a_jax_script_written_for_a_cluster_trains_unchanged_on_two_nodes(sim_cluster, jax, tmp_path):
    config = jax_job(sim_cluster, tmp_path, "jx", "jax_data_parallel.py", args=["4"])
    result = homegpu("--config", str(config), "run", "jx", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    losses = {node: epoch_losses(result.stdout, node) for node in ("node1", "node2")}
    assert sorted(losses["node1"]) == [1, 2, 3, 4] and losses["node1"] == losses["node2"], losses  # one model
    assert losses["node1"][4] < losses["node1"][1], losses
    (run_dir,) = (tmp_path / "experiments").iterdir()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert set(manifest["jax"]) == {"node1", "node2"} and not manifest["tf_configs"]
    assert "HOMEGPU_JAX_PROCESS_ID=1" in manifest["jax"]["node2"]
    assert "<h3>jax.distributed per process</h3>" in (run_dir / "report.html").read_text()
    assert not worker_processes(sim_cluster)


def test_a_keras_3_script_on_jax_trains_with_keras_distribution_across_two_nodes(sim_cluster, jax, tmp_path):
    """keras.io's way across machines: KERAS_BACKEND "jax" set by the script, keras.distribution.initialize() with
    no arguments, DataParallel over every device of both processes; homegpu reads Keras's own epoch lines."""
    config = jax_job(sim_cluster, tmp_path, "k3", "keras3_jax.py", args=["3"])
    result = homegpu("--config", str(config), "run", "k3", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout + result.stderr
    for node in ("node1", "node2"):
        shown = re.findall(rf"^{node} \* epoch (\d)/3\s+loss ([0-9.]+)", result.stdout, re.MULTILINE)
        losses = {int(epoch): float(loss) for epoch, loss in shown}
        assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1], result.stdout


def test_a_killed_process_restarts_every_process_from_the_chiefs_snapshot(sim_cluster, jax, tmp_path):
    """Process 0 alone saves snapshot.npz in its working dir (a shared filesystem assumed, as most scripts do);
    node2's process killed mid-run, homegpu puts node1's snapshot onto node2 and both resume from its epoch."""
    config = jax_job(sim_cluster, tmp_path, "jxkill", "jax_data_parallel.py", args=["8", "1"],
                     checkpoint="snapshot.npz")

    def kill_node2s_process():
        victims = [pid for pid in worker_processes(sim_cluster) if pid in sim_cluster.node("node2").pids()]
        assert victims, "node2's process not found"
        os.kill(victims[0], signal.SIGKILL)

    status, text = run_and_strike(config, tmp_path, "node1 | [process 0] Epoch 2 | Training snapshot saved",
                                  kill_node2s_process, job="jxkill")
    print(text[-4000:])
    assert status == 0, text
    assert "generation 2" in text
    resumed = {int(e) for e in re.findall(r"\[process \d\] Resuming from snapshot at epoch (\d+)", text)}
    assert len(re.findall(r"Resuming from snapshot", text)) == 2 and len(resumed) == 1 and min(resumed) >= 3, text
    after = text[text.index("generation 2"):]
    assert "node2 * epoch 8/?" in after and "node2 * epoch 1/?" not in after  # node2 began at node1's snapshot
    assert not worker_processes(sim_cluster)


def test_the_jax_demo_from_init_trains_across_two_nodes(sim_cluster, jax, tmp_path):
    run_dir = run_init_demo(sim_cluster, tmp_path, "jax")
    assert (run_dir / "output" / "model.npz").is_file()


def test_serve_queues_a_jax_job_and_records_each_processs_epochs(sim_cluster, jax, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # serve and the commands inherit it
    config = jax_job(sim_cluster, tmp_path, "jxq", "jax_data_parallel.py", args=["3"])
    experiments = tmp_path / "experiments"
    with serving(config, tmp_path / "serve.log", experiments):
        entry = wait_state(config, submit(config, "jxq"), "succeeded", 400)
    assert recorded_epochs(experiments / entry["run_id"]) == {"node1": [1, 2, 3], "node2": [1, 2, 3]}
    assert not worker_processes(sim_cluster)


def test_homegpu_stop_ends_every_jax_process_and_the_run_as_stopped(sim_cluster, jax, tmp_path):
    config = jax_job(sim_cluster, tmp_path, "jxstop", "jax_data_parallel.py", args=["50", "1"])
    stopped = {}

    def stop():
        stopped["result"] = homegpu("--config", str(config), "stop", "jxstop", cwd=tmp_path)

    status, text = run_and_strike(config, tmp_path, "node2 * epoch 2/?", stop, job="jxstop")
    print(text[-3000:])
    assert stopped["result"].returncode == 0 and "stopped jxstop" in stopped["result"].stdout
    assert status == 130 and "generation 2" not in text, text  # stopped, not a failure to restart from
    wait_for(lambda: not worker_processes(sim_cluster), 30, "both processes to end")
