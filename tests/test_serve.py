"""`homegpu serve` on this machine (a cluster file of the test's own, so that its queue's folder in /tmp is
never that of a `homegpu --local serve` of yours or of another user), and its job board."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

from helpers import homegpu, homegpu_argv, local_cluster_toml, wait_for
from history_events import owned, process, tui_line, worker
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from homegpu.remote.config import parse_cluster
from homegpu.remote.events import JobState, JobStateChanged, Metric, NodeState, WorkerMetric
from homegpu.remote.node_side import PROTOCOL_VERSION, THROTTLE_REASONS
from homegpu.remote.nodes import Cluster, parse_agent_line, visible
from homegpu.remote.serve import ClusterCollector, JobBoard

# What a name on a shared box can carry: OSC 0 (retitle, ended by BEL), CSI 2J (clear), C1 CSI alone.
HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m"


def test_the_board_keeps_each_running_runs_latest_figures_and_drops_it_when_it_ends():
    board = JobBoard()
    board.handle(JobStateChanged("demo", "r1", JobState.RUNNING, 2, 1))
    board.handle(WorkerMetric("demo", "r1", "n0", 0, Metric({"event": "epoch", "epoch": 1, "loss": 0.9})))
    board.handle(WorkerMetric("demo", "r1", "n0", 0, Metric({"event": "step", "epoch": 2, "step": 5})))
    run = board.runs["r1"]
    assert (run.job, run.restarts) == ("demo", 1)
    assert (run.workers["n0"].epoch, run.workers["n0"].loss, run.workers["n0"].step) == (2, 0.9, 5)
    board.handle(JobStateChanged("demo", "r1", JobState.FAILED, 2, 1))
    assert board.runs == {}


def test_serve_prints_its_url_answers_prometheus_and_stops_cleanly_on_sigterm(tmp_path):
    config = local_cluster_toml(tmp_path, name="home")
    process = subprocess.Popen(homegpu_argv("--config", str(config), "serve", "--metrics-port", "0"), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first, second = process.stdout.readline(), process.stdout.readline()
        assert first.startswith("homegpu serve: home, 1 node(s)"), first
        url = second.split("metrics: ", 1)[1].strip()

        def scraped() -> str:
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                text = response.read().decode()
            return text if 'homegpu_node_cpu_percent{cluster="home",node="here"}' in text else ""

        text = wait_for(scraped, 30, "the local node's stats at /metrics")
        assert 'homegpu_node_up{cluster="home",node="here"} 1.0' in text
        assert "# TYPE homegpu_gpu_utilization_percent gauge" in text  # no GPU here: the family, with no sample
        served = {name if kind == "gauge" else name.removesuffix("_total") + "_total"  # a counter's samples
                  for name, kind in re.findall(r"^# TYPE (homegpu_\w+) (gauge|counter)$", text, re.M)}
        dashboard = (Path(__file__).parents[1] / "assets" / "grafana-dashboard.json").read_text()
        wanted = set(re.findall(r"homegpu_[a-z_]+", "".join(t["expr"] for p in json.loads(dashboard)["panels"]
                                                             for t in p["targets"])))
        assert wanted and wanted <= served, f"the dashboard asks for metrics serve does not have: {wanted - served}"
    finally:
        process.terminate()
        status = process.wait(timeout=30)
    assert status == 0 and "Traceback" not in process.stdout.read()


def test_a_busy_port_or_a_bad_address_is_one_line_naming_the_fix(tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        busy = homegpu("--config", str(local_cluster_toml(tmp_path)), "serve", "--metrics-port", str(port),
                       cwd=tmp_path, timeout=60)
    assert busy.returncode == 2 and busy.stderr.count("\n") == 1, busy.stderr
    assert f"cannot serve metrics on 127.0.0.1:{port}" in busy.stderr and "--metrics-port" in busy.stderr
    bad = homegpu("--local", "serve", "--listen", "my-laptop", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith("homegpu: error: --listen 'my-laptop' is not an IP address")


def scrape(stats, board: JobBoard | None = None) -> str:
    """/metrics' text for one online node, `gpubox`, whose latest stats are `stats`: the collector serve
    registers, with no connection made."""
    cluster = Cluster(parse_cluster('[cluster]\nname = "lab"\n[[nodes]]\nname = "gpubox"\nhost = "gpubox"\n'))
    node = cluster.node("gpubox")
    node.state, node.latest = NodeState.ONLINE, stats
    registry = CollectorRegistry()
    registry.register(ClusterCollector(cluster, board or JobBoard()))
    return generate_latest(registry).decode()


def samples(text: str, name: str) -> list[dict[str, str]]:
    """Each sample of the metric `name` as its labels read back by Prometheus's own parser, with `value`."""
    return [dict(sample.labels, value=sample.value) for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]


def test_metrics_show_a_nodes_control_characters_and_never_send_them():
    """A GPU, a process, a user, a job and a run named with terminal controls: `curl .../metrics` in a terminal
    prints their escapes (as the commands do), so nothing retitles, clears or writes the clipboard."""
    line = tui_line("h100_mig_load")
    line["gpus"][0]["name"] = f"H100{HOSTILE}"
    line["gpus"][0]["processes"][2]["name"] = f"./gpu_burn{HOSTILE}"
    board = JobBoard()
    board.handle(JobStateChanged(f"demo{HOSTILE}", f"r1{HOSTILE}", JobState.RUNNING, 1, 0))
    board.handle(WorkerMetric(f"demo{HOSTILE}", f"r1{HOSTILE}", "gpubox", 0, Metric({"event": "epoch", "epoch": 1})))
    stats = owned(line, [process(f"eve{HOSTILE}"), process("eve"), worker("alice", f"demo{HOSTILE}", f"r1{HOSTILE}")])
    text = scrape(stats, board)
    assert not set(text) & {"\x1b", "\x07", "\x9b"}, "a control character reached /metrics"
    (gpu,) = samples(text, "homegpu_gpu_temperature_celsius")
    assert gpu["model"] == visible(f"H100{HOSTILE}") == "H100\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m"
    burn = next(sample for sample in samples(text, "homegpu_gpu_process_memory_used_bytes")
                if sample["process"].startswith("./gpu_burn"))
    assert (burn["process"], burn["job"], burn["run"]) == tuple(visible(f"{word}{HOSTILE}") for word in
                                                                ("./gpu_burn", "demo", "r1"))
    assert {sample["user"] for sample in samples(text, "homegpu_gpu_process_memory_used_bytes")} >= {
        visible(f"eve{HOSTILE}")}
    (epoch,) = samples(text, "homegpu_job_epoch")
    assert (epoch["job"], epoch["run"]) == (visible(f"demo{HOSTILE}"), visible(f"r1{HOSTILE}"))


def test_process_memory_is_one_series_per_name_and_owner_never_per_pid():
    """Every pid a series of its own would be a new series in Prometheus for each process ever started:
    the processes that share a GPU, a name and an owner are one series, their memory summed."""
    # the recorded H100 (MIG, under load): two /root/tools/memhog (2296 + 1272 MiB) and ./gpu_burn (7484 MiB)
    stats = owned(tui_line("h100_mig_load"), [process("alice"), process("alice"), process("bob")])
    series = samples(scrape(stats), "homegpu_gpu_process_memory_used_bytes")
    assert all("pid" not in sample for sample in series), series
    memory = {(sample["process"], sample["user"]): sample["value"] for sample in series}
    assert memory == {("/root/tools/memhog", "alice"): (2296 + 1272) * 1024 * 1024,
                      ("./gpu_burn", "bob"): 7484 * 1024 * 1024}
    assert all((sample["node"], sample["gpu"], sample["job"], sample["run"]) == ("gpubox", "0", "", "")
               for sample in series)


def test_energy_counters_come_from_the_history_and_sum_per_node(tmp_path):
    """homegpu_gpu_energy_joules_total per GPU and homegpu_node_energy_joules_total per node: the totals the
    history recorder keeps (Prometheus's own parser reads them as counters)."""
    cluster = Cluster(parse_cluster('[cluster]\nname = "lab"\n[[nodes]]\nname = "gpubox"\nhost = "gpubox"\n'))
    totals = [("gpubox", 0, "NVIDIA H100 NVL", "GPU-806f", 3600.5), ("gpubox", 1, "NVIDIA H100 NVL", "GPU-db6d", 10.0)]
    registry = CollectorRegistry()
    registry.register(ClusterCollector(cluster, JobBoard(), lambda: totals))
    text = generate_latest(registry).decode()
    families = {family.name: family.type for family in text_string_to_metric_families(text)}
    assert families["homegpu_gpu_energy_joules"] == families["homegpu_node_energy_joules"] == "counter"
    gpus = {(s["gpu"], s["uuid"]): s["value"] for s in samples(text, "homegpu_gpu_energy_joules_total")}
    assert gpus == {("0", "GPU-806f"): 3600.5, ("1", "GPU-db6d"): 10.0}
    (node,) = samples(text, "homegpu_node_energy_joules_total")
    assert (node["node"], node["value"]) == ("gpubox", 3610.5)


def test_what_holds_a_gpu_back_is_a_series_per_reason_and_figure_and_nothing_where_unknown():
    """Issue 35: each clock event reason 1 or 0 (none where the node cannot read them: a 0 would say "not
    held back"), the clocks with their maximums and the PCIe link against what card and slot can do. Built
    from documented values (no recording of a throttling card exists): GPU 0 thermal-throttled on a riser,
    GPU 1 from an agent older than the health keys."""
    hot = {"index": 0, "name": "NVIDIA GeForce RTX 3090", "uuid": "GPU-0", "util": 97, "temp": 87,
           "sm_clock": 1200, "throttle": ["hw_thermal", "sw_power_cap"], "sm_clock_max": 1860, "mem_clock": 9501,
           "mem_clock_max": 9751, "pcie": {"gen": 3, "width": 1, "max_gen": 4, "max_width": 16, "gpu_max_gen": 4,
                                           "gpu_max_width": None}}
    older = {"index": 1, "name": "NVIDIA GeForce RTX 3090", "uuid": "GPU-1", "util": 97}
    text = scrape(parse_agent_line(json.dumps({"v": PROTOCOL_VERSION, "t": 1.0, "source": "nvml",
                                               "gpus": [hot, older]})))
    reasons = {(s["gpu"], s["reason"]): s["value"] for s in samples(text, "homegpu_gpu_clock_event_reason_active")}
    assert {reason for _, reason in reasons} == {name for _, name in THROTTLE_REASONS}
    assert {key: value for key, value in reasons.items() if value} == {("0", "hw_thermal"): 1, ("0", "sw_power_cap"): 1}
    assert reasons[("0", "gpu_idle")] == 0 and not any(gpu == "1" for gpu, _ in reasons)
    figures = {name: {s["gpu"]: s["value"] for s in samples(text, name)} for name in (
        "homegpu_gpu_sm_clock_mhz", "homegpu_gpu_sm_clock_max_mhz", "homegpu_gpu_memory_clock_mhz",
        "homegpu_gpu_memory_clock_max_mhz", "homegpu_gpu_pcie_link_generation", "homegpu_gpu_pcie_link_width",
        "homegpu_gpu_pcie_link_generation_max", "homegpu_gpu_pcie_link_width_max",
        "homegpu_gpu_pcie_link_generation_gpu_max", "homegpu_gpu_pcie_link_width_gpu_max")}
    assert [figure.get("0") for figure in figures.values()] == [1200, 1860, 9501, 9751, 3, 1, 4, 16, 4, None]
    assert not any("1" in figure for figure in figures.values()), "a figure the older agent never sent"
    (labels,) = [s for s in samples(text, "homegpu_gpu_pcie_link_width") if s["gpu"] == "0"]
    assert (labels["cluster"], labels["node"], labels["model"], labels["uuid"]) == (
        "lab", "gpubox", "NVIDIA GeForce RTX 3090", "GPU-0")


def test_pcie_traffic_is_a_series_per_direction_and_xids_a_count_and_a_code():
    """Issue 35: NVML's PCIe throughput (MB/s in the line, bytes/s here) and the XIDs the driver logged since
    boot with the last one's code (tests/test_gpu_xid.py). GPU 1 read by nvidia-smi (no traffic figure) on a node
    whose user cannot read the kernel log (xid null); GPU 2 with no XID yet: a count of 0 and no code."""
    busy = {"index": 0, "name": "NVIDIA H100 NVL", "uuid": "GPU-0", "util": 97,
            "pcie": {"gen": 5, "width": 16, "tx_mbs": 1250.0, "rx_mbs": 24.5},
            "xid": {"count": 3, "last": 79, "last_at": 1_795_338_000.0}}
    smi = {"index": 1, "name": "NVIDIA H100 NVL", "uuid": "GPU-1", "util": 97,
           "pcie": {"gen": 5, "width": 16, "tx_mbs": None, "rx_mbs": None}, "xid": None}
    clean = {"index": 2, "name": "NVIDIA H100 NVL", "uuid": "GPU-2", "util": 0,
             "xid": {"count": 0, "last": None, "last_at": None}}
    text = scrape(parse_agent_line(json.dumps({"v": PROTOCOL_VERSION, "t": 1.0, "source": "nvml",
                                               "gpus": [busy, smi, clean]})))
    traffic = {(s["gpu"], s["direction"]): s["value"]
               for s in samples(text, "homegpu_gpu_pcie_throughput_bytes_per_second")}
    assert traffic == {("0", "tx"): 1_250_000_000, ("0", "rx"): 24_500_000}
    assert {s["gpu"]: s["value"] for s in samples(text, "homegpu_gpu_xid_errors")} == {"0": 3, "2": 0}
    assert {s["gpu"]: s["value"] for s in samples(text, "homegpu_gpu_last_xid")} == {"0": 79}
