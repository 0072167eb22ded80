"""The rest of the machines' energy on the test LAN. node2 has RAPL: a tree in the kernel's powercap format
(tests/rapl.py: package 30 W with its core inside, DRAM 5 W, starting just below the counters' wrap) mounted at
/sys/class/powercap in its own mount namespace, where its stats agent reads it as on a real machine. node3 has
none (as these VMs), and idle_watts/busy_watts in cluster.toml; node1 neither: GPU only. A run on node2 and node3
says each part and how it was obtained; serve's /metrics and `history --json` agree with the draw."""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from helpers import homegpu, wait_for
from prometheus_client.parser import text_string_to_metric_families

from rapl import RaplTree
from simcluster import SimCluster, SimNode, free_job_port
from test_energy_lan import start_serve
from homegpu.remote.energy import integrate
from homegpu.remote.record.energy import ESTIMATED, RAPL, energy_of
from homegpu.remote.record.run_folder import RunFolder
from homegpu.remote.record.timeline import load_timeline

RAPL_WATTS = 35.0  # package 30 W + DRAM 5 W (the core's 20 W is inside the package's)
IDLE, BUSY = 60.0, 160.0
BUSY_SCRIPT = "import time\nprint('busy', flush=True)\ntime.sleep(12)\nprint('done', flush=True)\n"
WATTS = {"node3": {"idle_watts": IDLE, "busy_watts": BUSY}}


@contextlib.contextmanager
def rapl_on(node: SimNode, folder: Path) -> Iterator[RaplTree]:
    """`node` restarted with a running RAPL tree at its /sys/class/powercap; restarted without it after."""
    tree = RaplTree(folder)
    node.powercap = folder
    node.restart()
    try:
        with tree.running():
            yield tree
    finally:
        node.powercap = None
        node.restart()


def test_a_run_counts_rapl_on_one_node_and_the_estimate_on_another(sim_cluster: SimCluster, tmp_path):
    (tmp_path / "busy.py").write_text(BUSY_SCRIPT)
    job = {"python": sys.executable, "script": "busy.py", "nodes": ["node2", "node3"], "port": free_job_port(),
           "max_restarts": 0}
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"busy": job}, price_per_kwh=0.40,
                                            currency="EUR", node_overrides=WATTS)
    with rapl_on(sim_cluster.node("node2"), tmp_path / "powercap"):
        result = homegpu("--config", str(config), "run", "busy", "--no-tui", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    energy = energy_of(run_dir)
    node2, node3 = energy.hosts["node2"], energy.hosts["node3"]
    assert node2.method == RAPL and node2.seconds >= 10
    # across the counters' wrap; the fake counter's ticker (a thread of this busy process) may lag a second behind the
    # agent's read at either end of the window: 35 J
    assert node2.joules == pytest.approx(RAPL_WATTS * node2.seconds, rel=0.02, abs=RAPL_WATTS)
    timeline = {node.name: node for node in load_timeline(RunFolder(run_dir).timeline).nodes}
    cpu = timeline["node3"].cpu  # the estimate from the CPU use node3's agent measured
    expected = integrate(cpu.times, [IDLE + (BUSY - IDLE) * c / 100 for c in cpu.values])
    assert node3.method == ESTIMATED and node3.joules == pytest.approx(expected.joules, rel=0.01)
    assert IDLE * node3.seconds <= node3.joules <= BUSY * node3.seconds
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("energy ")]
    assert line == energy.line() and f"rest of node2 {node2.kwh:.4g} kWh {RAPL}" in line and ESTIMATED in line
    assert energy.total.cost == pytest.approx(energy.total.kwh * 0.40)
    assert "rest of the machine kWh" in (run_dir / "report.html").read_text()


def host_counters(metrics_url: str) -> dict[str, float]:
    """homegpu_node_host_energy_joules_total by node, at serve's /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {sample.labels["node"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "homegpu_node_host_energy_joules_total"}


def test_serve_counts_each_machines_rest_and_history_says_how(sim_cluster: SimCluster, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", price_per_kwh=0.40, currency="EUR",
                                            node_overrides=WATTS)
    with rapl_on(sim_cluster.node("node2"), tmp_path / "powercap"):
        serve, url = start_serve(config, tmp_path)
        try:
            wait_for(lambda: host_counters(url).get("node2", 0) > RAPL_WATTS * 3, 60, "node2's RAPL energy")
            before = host_counters(url)
            wait_for(lambda: host_counters(url)["node2"] > before["node2"] + RAPL_WATTS * 10, 60, "ten seconds more")
            after = host_counters(url)
        finally:
            serve.terminate()
            assert serve.wait(timeout=60) == 0
    assert "node1" not in after  # neither RAPL nor idle_watts: GPU only, no guess
    assert IDLE * 10 <= after["node3"] - before["node3"] <= BUSY * 15
    history = json.loads(homegpu("--config", str(config), "history", "--since", "10m", "--json", cwd=tmp_path).stdout)
    nodes = {row["node"]: row for row in history["energy_by_node"]}
    assert (nodes["node2"]["host_method"], nodes["node3"]["host_method"]) == ("rapl", "estimated")
    assert nodes["node2"]["host_kwh"] * 3.6e6 == pytest.approx(after["node2"], abs=RAPL_WATTS * 3)
    assert nodes["node3"]["cost"] == pytest.approx(nodes["node3"]["energy_kwh"] * 0.40)
    text = homegpu("--config", str(config), "history", "--since", "10m", cwd=tmp_path).stdout
    (gpu_only,) = [line for line in text.splitlines() if "GPU only (RAPL not readable there" in line]
    assert "Energy of the rest of the machines" in text and "node1" in gpu_only and "node2" not in gpu_only
