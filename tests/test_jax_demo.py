"""homegpu's JAX demo (trainer/jax_demo.py) in two real processes on this machine, as homegpu starts them on two
nodes: one model (both print the same figures), its loss falls, and a restart resumes from the epoch both finished
even where one process's snapshot is ahead."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from homegpu.trainer.metrics import parse_metric_line

REPO = Path(__file__).resolve().parent.parent


def run_demo(folders: list[Path], *args: str) -> list[list[dict]]:
    """Run the demo as len(folders) processes, each with its output dir; each process's metric lines."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "HOMEGPU_JAX_ADDRESS": "127.0.0.1",
           "HOMEGPU_JAX_PROCESS_COUNT": str(len(folders)), "PYTHONPATH": str(REPO.parent)}
    processes = [subprocess.Popen([sys.executable, "-m", "homegpu.trainer.jax_demo", "--output", str(folder),
                                   "--steps-per-epoch", "20", *args], env={**env, "HOMEGPU_JAX_PROCESS_ID": str(index)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for index, folder in enumerate(folders)]
    try:
        outputs = [process.communicate(timeout=120)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert all(process.returncode == 0 for process in processes), outputs
    return [[metric for line in output.splitlines() if (metric := parse_metric_line(line))] for output in outputs]


def epochs_of(metrics: list[dict]) -> dict[int, tuple[float, float]]:
    return {m["epoch"]: (m["loss"], m["accuracy"]) for m in metrics if m["event"] == "epoch"}


def test_two_processes_train_one_model_and_its_loss_falls(jax, tmp_path):
    first, second = run_demo([tmp_path / "p0", tmp_path / "p1"], "--epochs", "2")
    assert [m["worker"] for m in first[:1] + second[:1]] == [0, 1] and first[0]["workers"] == 2
    assert first[0]["replicas"] == 2 and first[0]["global_batch_size"] == 128 and first[0]["collective"] == "gloo"
    losses = epochs_of(first)
    assert losses == epochs_of(second) and sorted(losses) == [1, 2]  # the same model on both
    assert losses[2][0] < losses[1][0] < 2.0, losses
    assert (tmp_path / "p0" / "model.npz").is_file() and not (tmp_path / "p1" / "model.npz").exists()
    assert (tmp_path / "p1" / "DONE").is_file()


def test_a_restart_resumes_from_the_epoch_every_process_finished(jax, tmp_path):
    """Process 1's snapshot is two epochs ahead (from another run): both resume at epoch 1 with process 0's
    state, and end with the model of a restart whose snapshots agreed."""
    import numpy as np

    moved, kept = [tmp_path / "p0", tmp_path / "p1"], [tmp_path / "q0", tmp_path / "q1"]
    run_demo(moved, "--epochs", "1")
    run_demo(kept, "--epochs", "1")
    run_demo([tmp_path / "ahead"], "--epochs", "2")
    shutil.copy(tmp_path / "ahead" / "backup" / "snapshot.npz", moved[1] / "backup" / "snapshot.npz")
    first, second = run_demo(moved, "--epochs", "3")
    run_demo(kept, "--epochs", "3")
    starts = [next(m for m in metrics if m["event"] == "start") for metrics in (first, second)]
    assert [(s["initial_epoch"], s["resumed"]) for s in starts] == [(1, True), (1, True)]  # the fewest finished
    assert sorted(epochs_of(first)) == [2, 3] and epochs_of(first) == epochs_of(second)
    with np.load(moved[0] / "model.npz") as resumed, np.load(kept[0] / "model.npz") as agreed:
        assert all(np.allclose(resumed[name], agreed[name], rtol=1e-5) for name in agreed.files)


def test_alone_without_homegpus_variables_it_trains_on_its_own(jax, tmp_path):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HOMEGPU_JAX", "JAX_COORD"))}
    result = subprocess.run([sys.executable, "-m", "homegpu.trainer.jax_demo", "--epochs", "1", "--steps-per-epoch",
                             "5", "--output", str(tmp_path)], env={**env, "PYTHONPATH": str(REPO.parent)},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    (start,) = [m for line in result.stdout.splitlines() if (m := parse_metric_line(line)) and m["event"] == "start"]
    assert start["workers"] == 1 and start["replicas"] == 1
