"""What a run cost, on the test LAN: node3's nvidia-smi replays an H100 recorded under load (702.84 W: these
machines have no GPU). A job runs there with a price in cluster.toml: the run's last line and its report say
its energy and cost. serve counts the GPU's energy for /metrics: killed and started again, its counter goes
on from what it had written, and the history agrees with it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import homegpu, homegpu_argv, wait_for
from prometheus_client.parser import text_string_to_metric_families

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


def gpu_energy_counter(metrics_url: str) -> float | None:
    """node3 GPU 0's homegpu_gpu_energy_joules_total at serve's /metrics (None before its first step)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "homegpu_gpu_energy_joules_total" and sample.labels.get("node") == "node3":
                return sample.value
    return None


def start_serve(config: Path, cwd: Path) -> tuple[subprocess.Popen, str]:
    """`homegpu serve --metrics-port 0` and its metrics URL, as its second line prints it."""
    process = subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", "0"), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [process.stdout.readline() for _ in range(2)]
    assert lines[1].startswith("metrics: http://127.0.0.1:"), "".join(lines)
    return process, lines[1].split()[1]


def test_serve_killed_and_started_again_keeps_the_energy_counter_and_loses_only_its_downtime(
        sim_cluster: SimCluster, tmp_path, monkeypatch):
    """/metrics' counter of node3's replayed H100 (702.84 W) grows at its draw; serve killed (SIGKILL) and started
    again after 10 s: the counter does not go back, and over the whole span it misses only the downtime; the
    history's kWh for the span agree with it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", price_per_kwh=0.40, currency="EUR")
    with replaying_node3(sim_cluster, H100 / "apps_idle.csv"):
        first, url = start_serve(config, tmp_path)
        try:
            wait_for(lambda: (gpu_energy_counter(url) or 0) > 702.84 * 5, 60, "node3's energy to be counted")
            before, began = gpu_energy_counter(url), time.time()
            time.sleep(10)
            killed_at, at_kill = time.time(), gpu_energy_counter(url)
            first.send_signal(signal.SIGKILL)
        finally:
            first.kill()
            first.wait()
        time.sleep(10)
        second, url = start_serve(config, tmp_path)
        try:
            restarted_at = time.time()
            assert gpu_energy_counter(url) == pytest.approx(at_kill, abs=702.84 * 2)  # what was written: not back
            wait_for(lambda: gpu_energy_counter(url) > at_kill + 702.84 * 5, 60, "the counter to go on")
            time.sleep(10)
            after, ended = gpu_energy_counter(url), time.time()
        finally:
            second.terminate()
            assert second.wait(timeout=60) == 0
    watched = (killed_at - began) + (ended - restarted_at)  # the downtime and the reconnect are not counted
    assert after - before == pytest.approx(702.84 * watched, rel=0.15)
    assert after - before < 702.84 * (ended - began - 8)  # the 10 s serve was down are missing, not guessed
    result = homegpu("--config", str(config), "history", "--since", "10m", "--json", cwd=tmp_path)
    (gpu,) = [g for g in json.loads(result.stdout)["energy_by_gpu"] if g["node"] == "node3"]
    # the history holds what was counted, and the samples serve wrote after the last reading (its stop: a second)
    assert gpu["energy_kwh"] * 3.6e6 == pytest.approx(after, abs=702.84 * 3)
    assert gpu["cost"] == pytest.approx(gpu["energy_kwh"] * 0.40)
