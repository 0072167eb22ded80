"""A machine that leaves for good (issue 37), on the test LAN: three machines train the built-in trainer with
`min_workers = 2`; one is switched off mid-run (every process of it killed, its sshd gone, as a power cut leaves
it) and does not come back within reconnect_timeout. The run goes on with the other two from the last finished
epoch, without spending a restart, and succeeds; losing the chief's machine loses no epoch (every worker keeps
the same backup on its own disk); fewer than min_workers left fails the run with the line that says so. Users' own
scripts (TensorFlow, PyTorch, JAX) through the same: tests/test_fewer_workers_scripts_lan.py."""

from __future__ import annotations

import re
import subprocess
from typing import Callable

from helpers import homegpu_argv, job_table, read_metrics, worker_processes
from simcluster import SimCluster

EPOCHS = 5
THREE = ["node1", "node2", "node3"]


def run_losing(sim: SimCluster, tmp_path, lost: str, job: str = "demo", then: tuple[str, Callable[[], None]] | None = None,
               lost_at: int = 2, **table) -> tuple[int, str]:
    """`homegpu run JOB --no-tui` on the three nodes (the built-in trainer, else `table`'s script); at `lost`'s
    epoch `lost_at` line its machine is switched off, and at the first line with `then`'s cue after that, `then` runs;
    a node still off is started again once the run has ended. Returns (exit status, output)."""
    schedule = {} if "script" in table else {"epochs": EPOCHS, "steps_per_epoch": 20}
    table = job_table(nodes=THREE, reconnect_timeout=8.0, **(schedule | table))
    config = sim.write_cluster_toml(tmp_path / "cluster.toml", jobs={job: table})
    process = subprocess.Popen(homegpu_argv("--config", str(config), "run", job, "--no-tui"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cues = [(re.compile(rf"^{lost} \* epoch {lost_at}/(\d+|\?) "), sim.node(lost).kill)]
    if then is not None:
        cues.append((re.compile(re.escape(then[0])), then[1]))
    output = []
    try:
        for line in process.stdout:
            output.append(line)
            if cues and cues[0][0].search(line):
                cues.pop(0)[1]()
        process.wait(timeout=600)
    finally:
        process.kill()
        for node in sim.nodes:
            if not node.is_running:
                node.start()
    text = "".join(output)
    print(text)  # the run as a user saw it (pytest -s)
    assert len(cues) == 0, f"the run ended before every step of the test was taken:\n{text}"
    return process.returncode, text


def finished_epochs(run_dir, worker: str) -> list[int]:
    return [m["epoch"] for m in read_metrics(run_dir) if m.get("event") == "epoch" and m["worker_label"] == worker]


def starts(run_dir, worker: str) -> list[dict]:
    return [m for m in read_metrics(run_dir) if m.get("event") == "start" and m["worker_label"] == worker]


def test_a_node_switched_off_for_good_and_the_run_goes_on_with_the_others(sim_cluster, tmp_path):
    status, text = run_losing(sim_cluster, tmp_path, "node3", min_workers=2)
    assert status == 0, text
    line = re.search(r"node3 lost \(offline 8 s\): going on with node1, node2 from epoch (\d) "
                     r"\(global batch 96 kept: 48 per worker\)", text)
    assert line, text
    assert "restart failed" not in text
    assert "== demo succeeded (run demo-" in text and ", generation 2, restarts 0): every worker succeeded" in text
    (run_dir,) = (tmp_path / "experiments").iterdir()
    resumed = [m for m in read_metrics(run_dir) if m.get("event") == "start" and m["worker_label"] == "node1"][-1]
    assert resumed["initial_epoch"] == int(line.group(1)) - 1 >= 2, resumed  # from its backup, not epoch 0
    assert sorted(set(finished_epochs(run_dir, "node1"))) == list(range(1, EPOCHS + 1))
    assert (run_dir / "output" / "model").is_dir()
    assert not worker_processes(sim_cluster)


def test_the_chiefs_machine_lost_and_the_next_node_takes_over_from_its_own_backup(sim_cluster, tmp_path):
    status, text = run_losing(sim_cluster, tmp_path, "node1", min_workers=2, on_fewer_workers="keep-worker-batch")
    assert status == 0, text
    assert re.search(r"node1 lost \(offline 8 s\): going on with node2, node3 from epoch \d \(global batch 64 of "
                     r"96: 32 per worker; the learning rate may need to follow\)", text), text
    (run_dir,) = (tmp_path / "experiments").iterdir()
    resumed = [m for m in read_metrics(run_dir) if m.get("event") == "start" and m["worker_label"] == "node2"][-1]
    assert resumed["initial_epoch"] >= 2, resumed
    assert (run_dir / "output" / "model").is_dir()  # node2's, the new chief's
    assert not worker_processes(sim_cluster)


def test_fewer_than_min_workers_left_fails_the_run_with_the_line(sim_cluster, tmp_path):
    status, text = run_losing(sim_cluster, tmp_path, "node2", min_workers=3)
    assert status != 0, text
    assert re.search(r"restart failed: node2 did not come back within 8 s \(offline: .*\); 2 of 3 workers left, "
                     r"fewer than the job's min_workers = 3", text), text
    assert not worker_processes(sim_cluster)


def test_a_lost_node_that_is_back_rejoins_at_the_end_of_the_epoch(sim_cluster, tmp_path):
    node3 = sim_cluster.node("node3")
    status, text = run_losing(sim_cluster, tmp_path, "node3", then=("node3 lost (offline 8 s)", node3.start),
                              min_workers=2, epochs=7)
    assert status == 0, text
    assert re.search(r"node3 back: rejoining with node1, node2, node3 from epoch \d \(global batch 96 as at the "
                     r"start: 32 per worker\)", text), text
    (run_dir,) = (tmp_path / "experiments").iterdir()
    back = starts(run_dir, "node3")[-1]
    assert back["initial_epoch"] >= 3, back  # from the backup homegpu put there, not its own stale one (epoch 2)
    assert finished_epochs(run_dir, "node3")[-1] == 7 and (run_dir / "output" / "model").is_dir()
    assert "restarts 0): every worker succeeded" in text and not worker_processes(sim_cluster)
