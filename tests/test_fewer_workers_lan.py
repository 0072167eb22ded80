"""A machine that leaves for good (issue 37), on the test LAN: three machines train the built-in trainer with
`min_workers = 2`; one is switched off mid-run (every process of it killed, its sshd gone, as a power cut leaves
it) and does not come back within reconnect_timeout. The run goes on with the other two from the last finished
epoch, without spending a restart, and succeeds; losing the chief's machine loses no epoch (every worker keeps
the same backup on its own disk); fewer than min_workers left fails the run with the line that says so."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from helpers import homegpu_argv, job_table, read_metrics, worker_processes
from simcluster import SimCluster

EPOCHS = 5
DDP_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "ddp_tutorial.py"
JAX_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "jax_data_parallel.py"
THREE = ["node1", "node2", "node3"]


def run_losing(sim: SimCluster, tmp_path, lost: str, job: str = "demo", then: tuple[str, Callable[[], None]] | None = None,
               **table) -> tuple[int, str]:
    """`homegpu run JOB --no-tui` on the three nodes (the built-in trainer, else `table`'s script); at `lost`'s
    epoch 2 line its machine is switched off, and at the first line with `then`'s cue after that, `then` runs;
    a node still off is started again once the run has ended. Returns (exit status, output)."""
    schedule = {} if "script" in table else {"epochs": EPOCHS, "steps_per_epoch": 20}
    table = job_table(nodes=THREE, reconnect_timeout=8.0, **(schedule | table))
    config = sim.write_cluster_toml(tmp_path / "cluster.toml", jobs={job: table})
    process = subprocess.Popen(homegpu_argv("--config", str(config), "run", job, "--no-tui"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cues = [(re.compile(rf"^{lost} \* epoch 2/(\d+|\?) "), sim.node(lost).kill)]
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


TUTORIAL_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "tf_tutorial_backup.py"


def test_a_tutorial_script_with_backup_and_restore_goes_on_from_the_chiefs_copied_backup(sim_cluster, tmp_path):
    """Stock BackupAndRestore saves on the chief only; the chief's machine leaves, and node2 (now the chief) and
    node3 resume from the copy homegpu kept off node1, not from epoch 1."""
    (tmp_path / "tutorial").mkdir()
    shutil.copy(TUTORIAL_SCRIPT, tmp_path / "tutorial" / "train.py")
    status, text = run_losing(sim_cluster, tmp_path, "node1", job="tutorial", script="tutorial/train.py",
                              args=["6"], min_workers=2)
    assert status == 0, text
    line = re.search(r"node1 lost \(offline 8 s\): going on with node2, node3 from epoch (\d) \(the script's own "
                     r"batch\)", text)
    assert line and int(line[1]) >= 2, text
    (run_dir,) = (tmp_path / "experiments").iterdir()
    log = (run_dir / "logs" / "node2.log").read_text()
    second = log[log.index("generation 2 starting"):]
    first_epoch = re.search(r"^Epoch (\d+)/6$", second, re.M)
    assert first_epoch and int(first_epoch[1]) == int(line[1]), second[:3000]  # resumed, as the line said
    assert not worker_processes(sim_cluster)


def test_a_pytorch_ddp_script_goes_on_from_the_chiefs_snapshot_and_the_node_back_rejoins(sim_cluster, pytorch,
                                                                                         tmp_path):
    """The ddp-tutorial script saves a snapshot on every node (local rank 0); torchrun starts again on the two nodes
    left (--nnodes=2), and both resume from the chief's, which homegpu put onto node2 over its own. node3 is switched
    on again: at the chief's next epoch end all three start again (--nnodes=3) from the chief's snapshot, put onto
    node3 over the stale one it kept from before it left."""
    (tmp_path / "ddp").mkdir()
    shutil.copy(DDP_SCRIPT, tmp_path / "ddp" / "multinode.py")
    node3 = sim_cluster.node("node3")
    status, text = run_losing(sim_cluster, tmp_path, "node3", job="ddp", framework="pytorch", script="ddp/multinode.py",
                              args=["10", "1"], min_workers=2, env={"EPOCH_PAUSE": "1"},
                              then=("node3 lost (offline 8 s)", node3.start))
    assert status == 0, text
    assert ("node3 lost (offline 8 s): going on with node1, node2 from the script's own checkpoint if it keeps one, "
            "else from its start (the script's own batch)") in text, text
    second = text[text.index("generation 2 starting"):text.index("node3 back: rejoining")]
    resumed = {int(epoch) for epoch in re.findall(r"Resuming training from snapshot at Epoch (\d+)", second)}
    assert len(resumed) == 1 and min(resumed) >= 2, second
    assert ("node3 back: rejoining with node1, node2, node3 from the script's own checkpoint if it keeps one, else "
            "from its start (the script's own batch)") in text, text
    third = text[text.index("generation 3 starting"):]
    again = re.findall(r"node(\d) \| .*Resuming training from snapshot at Epoch (\d+)", third)
    assert {node for node, _ in again} == {"1", "2", "3"}, third  # every rank, node3's from the chief's copy
    assert len({int(epoch) for _, epoch in again}) == 1 and int(again[0][1]) > min(resumed), third
    assert "node3 * epoch 10/?" in third and not worker_processes(sim_cluster)  # its Epoch 9, the last


def test_a_jax_script_goes_on_with_fewer_processes_and_the_node_back_rejoins(sim_cluster, jax, tmp_path):
    """A jax.distributed script whose process 0 alone saves its snapshot: node3 switched off, the run starts again
    on two processes (jax.distributed with a count of 2), both from the chief's snapshot, which homegpu put onto
    node2; node3 switched on again rejoins at the chief's next epoch end, from the same snapshot."""
    (tmp_path / "jax").mkdir()
    shutil.copy(JAX_SCRIPT, tmp_path / "jax" / JAX_SCRIPT.name)
    node3 = sim_cluster.node("node3")
    status, text = run_losing(sim_cluster, tmp_path, "node3", job="jx", script=f"jax/{JAX_SCRIPT.name}",
                              args=["30", "1"], min_workers=2, checkpoint="snapshot.npz",
                              then=("node3 lost (offline 8 s)", node3.start))
    assert status == 0, text
    assert "node3 lost (offline 8 s): going on with node1, node2" in text, text
    second = text[text.index("generation 2 starting"):text.index("node3 back: rejoining")]
    resumed = re.findall(r"node(\d) \| \[process \d\] Resuming from snapshot at epoch (\d+)", second)
    assert {node for node, _ in resumed} == {"1", "2"} and len({epoch for _, epoch in resumed}) == 1, second
    assert "node3 back: rejoining with node1, node2, node3" in text, text
    third = text[text.index("generation 3 starting"):]
    again = re.findall(r"node(\d) \| \[process \d\] Resuming from snapshot at epoch (\d+)", third)
    assert {node for node, _ in again} == {"1", "2", "3"}, third  # node3's from the chief's copy
    assert len({int(epoch) for _, epoch in again}) == 1 and int(again[0][1]) > int(resumed[0][1]), third
    assert "node3 * epoch 30/?" in third and not worker_processes(sim_cluster)
