"""`homegpu serve` on the test LAN, scraped by a real Prometheus server (Debian's `prometheus`).

node3's nvidia-smi replays output recorded on a real H100 (tests/fixtures/gpu/h100-80gb-hbm3: these machines
have no GPU); node1 and node2 run a job started by `homegpu run` in another process, which serve follows.
The values are read back through Prometheus's own HTTP API, as Grafana reads them.
"""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gpu_replay import FIXTURES, HOT_ON_A_RISER, nvidia_smi_in
from helpers import homegpu_argv, job_table, wait_for
from simcluster import SimCluster, free_port


H100 = FIXTURES / "h100-80gb-hbm3"
PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = Path(__file__).parents[1] / "assets" / "grafana-dashboard.json"


@contextmanager
def serving(config: Path, cwd: Path) -> Iterator[str]:
    """`homegpu serve --metrics-port 0`; yields its metrics URL, as its first lines print it."""
    process = subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", "0"), cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = [process.stdout.readline() for _ in range(2)]
        assert lines[1].startswith("metrics: http://127.0.0.1:"), "".join(lines) + process.stdout.read()
        yield lines[1].split()[1]
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0, process.stdout.read()


@contextmanager
def prometheus_scraping(target: str, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus server scraping `target` (host:port) every second; yields its API's base URL."""
    assert Path(PROMETHEUS).is_file(), "Debian's prometheus is missing: tests/run.sh installs it"
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                  "scrape_configs": [{"job_name": "homegpu", "static_configs": [
                                      {"targets": [target]}]}]}))  # JSON is YAML
    port = free_port("127.0.0.1")
    process = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"))
    try:
        yield f"http://127.0.0.1:{port}/api/v1"
    finally:
        process.terminate()
        process.wait(timeout=30)


def query(api: str, expression: str) -> dict[str, float]:
    """Prometheus's instant query: each series' labels (as k=v,k=v) → its value; {} while it has none."""
    url = f"{api}/query?" + urllib.parse.urlencode({"query": expression})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            result = json.load(response)["data"]["result"]
    except OSError:
        return {}  # Prometheus is still starting
    return {",".join(f"{k}={v}" for k, v in sorted(series["metric"].items()) if k not in ("instance", "job")):
            float(series["value"][1]) for series in result}


def test_prometheus_scrapes_the_gpus_nodes_and_a_running_job_from_serve(sim_cluster: SimCluster, tmp_path: Path):
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", price_per_kwh=0.35, currency="EUR", jobs={
        "demo": job_table(epochs=30, steps_per_epoch=20)})
    health = tmp_path / "health.csv"  # in HW thermal slowdown on a riser (test_gpu_health_lan.py's row)
    health.write_text(HOT_ON_A_RISER)
    with nvidia_smi_in(sim_cluster.node("node3").extra_path, H100 / "gpus_load.csv", H100 / "apps_load.csv",
                       version_fixture=H100 / "smi_version.txt", health_fixture=health), \
            serving(config, tmp_path) as metrics_url, \
            prometheus_scraping(urllib.parse.urlsplit(metrics_url).netloc, tmp_path) as api:
        up = wait_for(lambda: (found := query(api, "homegpu_node_up")) and len(found) == 3 and found, 60,
                      "Prometheus to scrape every node's state")
        assert set(up.values()) == {1.0}, up
        gpu = wait_for(lambda: query(api, "homegpu_gpu_utilization_percent"), 30, "the H100's utilisation")
        (labels, value), = gpu.items()
        assert value == 100.0 and "node=node3" in labels and "gpu=0" in labels, gpu
        assert "model=NVIDIA H100 80GB HBM3" in labels and "uuid=GPU-ca8fe467-fe37-ae67-8b9e-505cc8110be1" in labels
        memory = query(api, "homegpu_gpu_memory_used_bytes")
        assert list(memory.values()) == [20085 * 1024 * 1024], memory
        assert list(query(api, "homegpu_gpu_power_watts").values()) == [702.84]
        # the GPU's energy counter, from serve's history (test_energy_lan.py checks its rate against the draw)
        (first,) = wait_for(lambda: list(query(api, "homegpu_gpu_energy_joules_total").values()), 60,
                            "node3's energy counter in Prometheus")
        wait_for(lambda: list(query(api, "homegpu_gpu_energy_joules_total").values())[0] >= first + 702.84, 30,
                 "the counter to grow")
        assert list(query(api, "homegpu_electricity_price_per_kwh").values()) == [0.35]

        run = subprocess.Popen(homegpu_argv("--config", str(config), "run", "demo", "--no-tui"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            epochs = wait_for(lambda: (found := query(api, "homegpu_job_epoch")) and len(found) == 2
                              and min(found.values()) >= 2 and found, 240, "both workers' epochs in Prometheus")
            assert {label.split("worker=")[1] for label in epochs} == {"node1", "node2"}, epochs
            assert all("job=demo" in label for label in epochs), epochs
            rates = query(api, "homegpu_job_examples_per_second")
            assert len(rates) == 2 and all(rate > 0 for rate in rates.values()), rates
            assert len(query(api, "homegpu_job_loss")) == 2
            assert list(query(api, "homegpu_job_restarts").values()) == [0.0]
            # Grafana is not packaged by Debian: every panel of the dashboard asks this Prometheus instead,
            # and each finds data (the GPU panels node3's replayed H100, the job panels this run).
            for panel in json.loads(DASHBOARD.read_text())["panels"]:
                for target in panel["targets"]:
                    expression = target["expr"].replace("$cluster", ".*").replace("$node", ".*")
                    assert query(api, expression), f"the panel {panel['title']!r} finds nothing: {expression}"
        finally:
            run.terminate()  # homegpu stops every worker
            run.wait(timeout=60)
        # serve sees the run is gone (its workers' statuses) and its series end in Prometheus too
        wait_for(lambda: not query(api, "homegpu_job_epoch"), 60, "the stopped run's series to end")
