"""A machine that leaves for good and comes back (issue 37, issue 46) with users' own scripts, on the test LAN:
a TensorFlow tutorial's BackupAndRestore, the PyTorch DDP tutorial and a jax.distributed script go on from the
chief's checkpoint on the nodes left, and a node that is back rejoins from it (run_losing: the built-in trainer's
module, tests/test_fewer_workers_lan.py). A module of its own so that pytest-xdist runs it beside that one."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from helpers import worker_processes
from test_fewer_workers_lan import run_losing

DDP_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "ddp_tutorial.py"
JAX_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "jax_data_parallel.py"
TUTORIAL_SCRIPT = Path(__file__).parent / "fixtures" / "scripts" / "tf_tutorial_backup.py"


def test_a_tutorial_script_with_backup_and_restore_goes_on_from_the_chiefs_copied_backup(sim_cluster, tmp_path):
    """Stock BackupAndRestore saves on the chief only; the chief's machine leaves, and node2 (now the chief) and
    node3 resume from the copy homegpu kept off node1, not from epoch 1. node1 leaves at its third epoch's line: the
    copy of an epoch is taken while the next one trains, and on a busy machine an epoch here (seconds) can end first."""
    (tmp_path / "tutorial").mkdir()
    shutil.copy(TUTORIAL_SCRIPT, tmp_path / "tutorial" / "train.py")
    status, text = run_losing(sim_cluster, tmp_path, "node1", job="tutorial", script="tutorial/train.py",
                              args=["6"], min_workers=2, lost_at=3)
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
