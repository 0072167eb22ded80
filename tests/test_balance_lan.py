"""Unlike machines on the test LAN: the built-in trainer on two nodes, one of which becomes slow for real mid-run
(its worker moved into a cgroup held to a fifth of a core), and each worker's share of a step follows within an
epoch or two."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

from helpers import read_metrics, run_and_strike, worker_processes, write_config
from simcpu import cpu_quota, own_core

EPOCHS = 6


def test_the_shares_follow_a_node_that_becomes_slow_mid_run(sim_cluster, tmp_path):
    config = write_config(sim_cluster, tmp_path, epochs=EPOCHS, steps_per_epoch=24, batch_size=32)
    # Alike machines, each with a whole core that a busy suite cannot take (the top weight), until node2's worker is
    # held to a fifth of one
    with own_core(sim_cluster.node("node1")), own_core(sim_cluster.node("node2")), ExitStack() as quotas:
        def slow_node2() -> None:
            on_node2 = set(sim_cluster.node("node2").pids())
            for pid in worker_processes(sim_cluster):
                if pid in on_node2:
                    quotas.enter_context(cpu_quota(pid, f"homegpu-test-balance-{pid}", 20))

        status, output = run_and_strike(config, tmp_path, "node1 * epoch 2/", slow_node2)
    assert status == 0, output[-4000:]
    (run_dir,) = (tmp_path / "experiments").iterdir()
    chief = {m["epoch"]: m for m in read_metrics(Path(run_dir))
             if m.get("event") == "epoch" and m["worker_label"] == "node1"}
    before = chief[2]["shares"]
    assert abs(before[0] - before[1]) <= 8, chief  # alike machines: about even
    after = chief[EPOCHS]["shares"]
    assert after[0] > 2 * after[1], {epoch: line["shares"] for epoch, line in chief.items()}
    assert chief[EPOCHS]["compute_examples_per_sec"] > 0, chief[EPOCHS]  # its own speed, the next plan's
    assert "each replica's share of a step is now" in output
