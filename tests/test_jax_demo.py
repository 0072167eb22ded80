"""The built-in JAX demo (trainer/jax_demo.py) in real processes on this machine: two of them joined by
jax.distributed through homegpu's variables (trainer/jax_cluster.py) train as one, their replicas identical; a
rerun resumes from their snapshots, at the fewest epochs any finished; one process alone trains without them."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from homegpu.trainer.metrics import parse_metric_line

TIMEOUT = 120  # seconds a run of the demo may take here (about 15 on two busy cores)
STEPS = ("--steps-per-epoch", "20")
# homegpu's own variables, which a lone process must not see (they may be set around the test run)
JAX_RUN_ENV = ("HOMEGPU_JAX_PROCESS_COUNT", "HOMEGPU_JAX_PROCESS_ID", "HOMEGPU_JAX_ADDRESS", "JAX_COORDINATOR_ADDRESS")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def base_env() -> dict[str, str]:
    """This environment (PYTHONPATH as it is) without homegpu's JAX variables, JAX on the CPU."""
    return {**{key: value for key, value in os.environ.items() if key not in JAX_RUN_ENV}, "JAX_PLATFORMS": "cpu"}


def run_demo(outputs: list[Path], *args: str) -> list[list[dict]]:
    """The demo in one process per output dir (more than one: joined as homegpu joins them); each process's
    metric lines, once every process exited 0."""
    env, port = base_env(), free_port()
    if len(outputs) > 1:
        env.update(HOMEGPU_JAX_PROCESS_COUNT=str(len(outputs)), HOMEGPU_JAX_ADDRESS="127.0.0.1",
                   JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}")
    processes = []
    try:
        for index, output in enumerate(outputs):
            argv = [sys.executable, "-m", "homegpu.trainer.jax_demo", "--batch-size", "64", *args,
                    "--output", str(output)]
            extra = {"HOMEGPU_JAX_PROCESS_ID": str(index)} if len(outputs) > 1 else {}
            processes.append(subprocess.Popen(argv, env={**env, **extra}, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
        logs = [process.communicate(timeout=TIMEOUT)[0] for process in processes]
    finally:
        for process in processes:  # a process left waiting for a dead peer
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = [f"process {index} (exit {process.returncode}):\n{log[-3000:]}"
              for index, (process, log) in enumerate(zip(processes, logs)) if process.returncode != 0]
    assert not failed, "\n".join(failed)
    return [[metric for line in log.splitlines() if (metric := parse_metric_line(line))] for log in logs]


def events(metrics: list[dict], event: str) -> list[dict]:
    return [metric for metric in metrics if metric["event"] == event]


def losses(metrics: list[dict]) -> list[float]:
    return [metric["loss"] for metric in events(metrics, "epoch")]


@pytest.fixture(scope="module")
def two_epochs(jax, tmp_path_factory) -> tuple[list[Path], list[list[dict]]]:
    """Two processes, two epochs, uninterrupted: their output dirs and metric lines."""
    folder = tmp_path_factory.mktemp("jax-two")
    outputs = [folder / "p0", folder / "p1"]
    return outputs, run_demo(outputs, "--epochs", "2", *STEPS)


@pytest.fixture(scope="module")
def one_epoch(jax, tmp_path_factory) -> tuple[list[Path], list[list[dict]]]:
    """Two processes that stopped after one epoch: their output dirs (copy them before a rerun) and metric lines."""
    folder = tmp_path_factory.mktemp("jax-one")
    outputs = [folder / "p0", folder / "p1"]
    return outputs, run_demo(outputs, "--epochs", "1", *STEPS)


def copies(outputs: list[Path], into: Path) -> list[Path]:
    return [Path(shutil.copytree(output, into / output.name)) for output in outputs]


def test_two_processes_train_as_one_and_keep_identical_parameters(jax, two_epochs):
    import numpy as np

    outputs, metrics = two_epochs
    for worker, lines in enumerate(metrics):
        (start,) = events(lines, "start")
        assert (start["worker"], start["workers"], start["replicas"]) == (worker, 2, 2)
        assert (start["initial_epoch"], start["resumed"], start["collective"]) == (0, False, "gloo")
        assert (start["batch_size"], start["global_batch_size"], start["steps_per_epoch"]) == (64, 128, 20)
        assert [metric["epoch"] for metric in events(lines, "epoch")] == [1, 2]
        assert len(events(lines, "end")) == 1
    first, second = (losses(lines) for lines in metrics)
    assert first == second, "loss is over both processes' examples: both print the same"
    assert 1.0 < first[0] < 2.3 and first[1] < first[0] and first[1] < 2.0, first
    snapshots = [np.load(output / "backup" / "snapshot.npz") for output in outputs]
    assert int(snapshots[0]["epochs"]) == int(snapshots[1]["epochs"]) == 2
    assert all(np.array_equal(snapshots[0][name], snapshots[1][name]) for name in snapshots[0].files)
    assert all((output / "DONE").exists() for output in outputs)
    assert (outputs[0] / "model.npz").exists() and not (outputs[1] / "model.npz").exists()


def test_a_rerun_resumes_where_the_processes_left_off(jax, two_epochs, one_epoch, tmp_path):
    assert [losses(lines) for lines in one_epoch[1]] == [losses(two_epochs[1][0])[:1]] * 2
    rerun = run_demo(copies(one_epoch[0], tmp_path), "--epochs", "2", *STEPS)
    for lines in rerun:
        (start,) = events(lines, "start")
        assert (start["initial_epoch"], start["resumed"]) == (1, True)
        # epoch 2 alone, from epoch 1's state: what the uninterrupted run got
        assert losses(lines) == pytest.approx(losses(two_epochs[1][0])[1:], rel=1e-5)


def test_a_process_ahead_goes_back_to_the_fewest_epochs_any_finished(jax, two_epochs, one_epoch, tmp_path):
    """Process 0's snapshot is an epoch ahead of process 1's: both resume at epoch 1 with process 1's state, and
    end where the uninterrupted run ended."""
    import numpy as np

    outputs = copies(one_epoch[0], tmp_path)
    shutil.copy(two_epochs[0][0] / "backup" / "snapshot.npz", outputs[0] / "backup" / "snapshot.npz")
    rerun = run_demo(outputs, "--epochs", "2", *STEPS)
    for lines in rerun:
        (start,) = events(lines, "start")
        assert (start["initial_epoch"], start["resumed"]) == (1, True)
        assert losses(lines) == pytest.approx(losses(two_epochs[1][0])[1:], rel=1e-5)
    with np.load(outputs[0] / "model.npz") as resumed, np.load(two_epochs[0][0] / "model.npz") as uninterrupted:
        assert all(np.allclose(resumed[name], uninterrupted[name], rtol=1e-5) for name in uninterrupted.files)


def test_a_process_alone_trains_without_homegpus_variables(jax, tmp_path):
    (metrics,) = run_demo([tmp_path / "alone"], "--epochs", "2", *STEPS)
    (start,) = events(metrics, "start")
    assert (start["worker"], start["workers"], start["replicas"], start["global_batch_size"]) == (0, 1, 1, 64)
    trained = losses(metrics)
    assert len(trained) == 2 and trained[1] < trained[0] and trained[1] < 2.0, trained
    assert (tmp_path / "alone" / "DONE").exists() and (tmp_path / "alone" / "model.npz").exists()
