"""State files on the nodes that are not what homegpu wrote: `jobs`, `logs` and `stop` name the node
and the file and go on with the other nodes, on real sshd nodes.

The workers are started as the process runtime starts them (its node-side script over SSH), then a
state file is damaged on the node's own disk (its private ~/.homegpu, seen from here).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path


from helpers import homegpu, job_table, wait_for
from homegpu.remote.node_side.scripts import worker_process
from simcluster import NODE_HOME, SimCluster, alive


SCRIPT = Path(worker_process.__file__).read_text()
RUN_ID = "demo-20261201-120000-4242"


def start_worker(sim: SimCluster, node: str, index: int, shell: str) -> dict:
    """Start `sh -c SHELL` on `node` as worker `index` of RUN_ID of the job demo, as homegpu does."""
    meta = {"job": "demo", "run_id": RUN_ID, "index": index, "generation": 1}
    argv = ["python3", "-I", "-S", "-c", SCRIPT, "start", "--run-dir", f"~/.homegpu/runs/{RUN_ID}",
            "--label", node, "--log", f"{node}.g1.log", "--meta", json.dumps(meta), "--", "sh", "-c", shell]
    result = subprocess.run(sim.ssh_argv(sim.node(node), shlex.join(argv)), capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_a_damaged_state_file_is_named_and_the_other_nodes_workers_are_listed_followed_and_stopped(
        sim_cluster, tmp_path):
    config = sim_cluster.write_cluster_toml(  # job demo on node1 and node2; node3's python cannot run
        tmp_path / "cluster.toml", jobs={"demo": job_table()},
        node_overrides={"node3": {"python": "/nonexistent/python3"}})
    run_dir = sim_cluster.node("node1").work_dir / "runs" / RUN_ID
    sleeper = start_worker(sim_cluster, "node2", 1, "echo node2 says hello; exec sleep 300")["pid"]
    try:
        start_worker(sim_cluster, "node1", 0, "echo node1 was here")
        wait_for(lambda: (run_dir / "node1.exit").exists(), 20, "node1's worker to end")
        state = (run_dir / "node1.json").read_text()
        (run_dir / "node1.json").write_text(state[: len(state) // 2])  # cut short, as a full disk leaves it
        on_node = f"{NODE_HOME}/.homegpu/runs/{RUN_ID}/node1.json"

        listing = homegpu("--config", str(config), "jobs", cwd=tmp_path)
        assert "Traceback" not in listing.stdout + listing.stderr, listing.stderr
        assert listing.returncode == 1, listing.stdout + listing.stderr
        rows = [line.split() for line in listing.stdout.splitlines()]
        assert ["demo", RUN_ID, "node2", "node2", "1", "running"] in rows, listing.stdout
        assert ["?", RUN_ID, "node1", "node1", "?", "damaged"] in rows, listing.stdout
        assert any(row[:7] == ["?", "?", "?", "node3", "?", "not", "listed:"]
                   and "/nonexistent/python3" in " ".join(row) for row in rows), listing.stdout
        damaged = [line for line in listing.stdout.splitlines() if "is damaged" in line]
        assert len(damaged) == 1 and damaged[0].startswith(f"node1: {on_node} is damaged (truncated or not JSON (")
        assert damaged[0].endswith("homegpu cannot tell whether that worker runs: check on node1 (ps), stop it by "
                                   "hand if it does, then delete the file")

        logs = homegpu("--config", str(config), "logs", "demo", cwd=tmp_path)
        assert logs.returncode == 0 and "Traceback" not in logs.stderr, logs.stdout + logs.stderr
        assert "node2 | node2 says hello" in logs.stdout and "node1 | node1 was here" in logs.stdout

        stopped = homegpu("--config", str(config), "stop", "demo", cwd=tmp_path)
        assert "Traceback" not in stopped.stdout + stopped.stderr, stopped.stderr
        assert stopped.returncode == 1, stopped.stdout + stopped.stderr
        assert "node2: exited (-15)" in stopped.stdout
        assert f"node1: not stopped: node1: {on_node} is damaged" in stopped.stdout
        wait_for(lambda: not alive({sleeper}), 20, "node2's worker to end")

        (run_dir / "node1.json").unlink()  # what the line says to do
        again = homegpu("--config", str(config), "jobs", cwd=tmp_path)
        assert "damaged" not in again.stdout and "Traceback" not in again.stderr, again.stdout + again.stderr
        assert ["demo", RUN_ID, "node2", "node2", "1", "exited", "(-15)"] in [
            line.split() for line in again.stdout.splitlines()]
    finally:
        subprocess.run(sim_cluster.ssh_argv(sim_cluster.node("node2"), f"kill -9 {int(sleeper)} 2>/dev/null; true"),
                       capture_output=True, timeout=30)
