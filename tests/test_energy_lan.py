"""What a run cost, on the test LAN: node3's nvidia-smi replays an H100 recorded under load (702.84 W: these
machines have no GPU), a job runs there with a price in cluster.toml, and the run's last line, its report and
run.json say its energy and cost."""

from __future__ import annotations

import sys

import pytest
from helpers import homegpu

from simcluster import SimCluster, free_job_port
from test_gpu_owners_cluster import H100, replaying_node3
from homegpu.remote.record.energy import energy_of

WATTS = 702.84  # tests/fixtures/gpu/h100-80gb-hbm3/gpus_load.csv
BUSY = "import time\nprint('busy', flush=True)\ntime.sleep(12)\nprint('done', flush=True)\n"


def test_a_run_on_a_replayed_gpu_says_its_energy_and_cost(sim_cluster: SimCluster, tmp_path):
    (tmp_path / "busy.py").write_text(BUSY)
    job = {"python": sys.executable, "script": "busy.py", "nodes": ["node3"], "port": free_job_port(),
           "max_restarts": 0}
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"busy": job}, price_per_kwh=0.40,
                                            currency="EUR")
    with replaying_node3(sim_cluster, H100 / "apps_idle.csv"):
        result = homegpu("--config", str(config), "run", "busy", "--no-tui", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    energy = energy_of(run_dir)
    node3 = energy.nodes["node3"]
    assert node3.seconds >= 10 and node3.joules == pytest.approx(WATTS * node3.seconds, rel=0.02)
    assert node3.cost == pytest.approx(node3.kwh * 0.40)
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("energy ")]
    assert line == energy.line() and line.endswith(" EUR") and "(node3 " in line
    assert "<h2>Energy</h2>" in (run_dir / "report.html").read_text()
