"""`homegpu doctor` against real sshd nodes, a real dockerd and iperf3, plus its pure judgements.

node3's PATH starts with a directory where some tests put a replaying `nvidia-smi` (output recorded
on real GPUs). This machine has no NVIDIA driver, so on node3 nvidia-smi lists two GPUs while NVML
cannot load. doctor reports that as ✗, not as a quiet fallback: on a real node nvidia-smi is itself
an NVML client, so a working nvidia-smi next to a failing NVML means the node's Python cannot load the
driver's library (a half-finished driver install or upgrade), and the NVIDIA container toolkit, which
loads that library too, would not give containers the GPUs either. The user sees the GPUs named, what
still works (stats from nvidia-smi) and one sentence on making libnvidia-ml loadable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
from helpers import homegpu

from gpu_replay import FIXTURES, nvidia_smi_in
from simcluster import SimCluster, free_job_port, free_port
from homegpu.remote.config.cluster_spec import load_cluster, parse_cluster
from homegpu.remote.doctor.check import Check
from homegpu.remote.doctor.gpus import gpu_check
from homegpu.remote.doctor.judge import (
    CHECK_NAMES, NodeFacts, address_check, address_kind, clock_check, clock_skew, disk_check, is_public_address,
    node_checks, python_check, tensorflow_check,
)
from homegpu.remote.doctor.probe import NOT_REACHABLE, diagnose, split_reason
from homegpu.remote.node_side.agent.smi_parse import parse_nvidia_smi_gpus
from homegpu.remote.nodes.cluster import Cluster
from homegpu.remote.nodes.stats import parse_agent_line
from homegpu.remote.nodes.transport import CommandResult
from homegpu.tui.cli.doctor import job_port
from homegpu.tui.view.text import format_check, format_report

REPLAY_GPUS = FIXTURES / "gpus_2x_h100nvl_idle.csv"
REPLAY_APPS = FIXTURES / "apps_none.csv"
# Checks that must pass on every healthy node here; docker and the NVIDIA runtime are not needed
# by runtime "process".
MUST_PASS = ("ssh", "host key", "python3", "tensorflow", "gpus", "iperf3", "disk", "clock", "job port", "address",
             "reachable")


def with_tensorflow(sim: SimCluster, path: Path, **changes) -> Path:
    """A cluster.toml whose nodes use this test's Python, which has TensorFlow (the nodes' python3 has not)."""
    overrides = {node.name: {"python": sys.executable} for node in sim.nodes}
    for name, table in changes.pop("node_overrides", {}).items():
        overrides[name].update(table)
    return sim.write_cluster_toml(path, node_overrides=overrides, **changes)


# -- helpers --------------------------------------------------------------------------------------


async def doctor(toml: Path, port: int) -> dict[str, dict[str, Check]]:
    """diagnose() on a fresh Cluster for `toml`, as {node: {check name: Check}}."""
    async with Cluster(load_cluster(toml), stream_stats=False) as cluster:
        checks = await diagnose(cluster, port)
    report: dict[str, dict[str, Check]] = {}
    for check in checks:
        report.setdefault(check.node, {})[check.name] = check
    for node, rows in report.items():
        assert tuple(rows) == CHECK_NAMES, f"{node}: checks out of order: {tuple(rows)}"
    return report


def node3_nvidia_smi(sim: SimCluster, replay: bool):
    """Put a replaying nvidia-smi on node3's PATH (or take any away); restore what was there after."""
    return nvidia_smi_in(sim.node("node3").extra_path, REPLAY_GPUS if replay else None, REPLAY_APPS)


@pytest.fixture
def cpu_only_node3(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    with node3_nvidia_smi(sim_cluster, replay=False):
        yield sim_cluster


@pytest.fixture
def replaying_node3(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    with node3_nvidia_smi(sim_cluster, replay=True):
        yield sim_cluster


def nvml_loads_here() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


# -- against the simulated cluster -----------------------------------------------------------------

async def test_healthy_process_cluster_passes_every_check(cpu_only_node3, tmp_path):
    report = await doctor(with_tensorflow(cpu_only_node3, tmp_path / "cluster.toml"), free_job_port())
    assert set(report) == {"node1", "node2", "node3"}
    for node, rows in report.items():
        failed = {name: row for name, row in rows.items() if row.ok is not True and name in MUST_PASS}
        assert not failed, f"{node}: {failed}"
        assert rows["docker"].ok is None and "not needed" in rows["docker"].detail
        assert rows["gpus"].detail == "no GPU (CPU-only node: trains on CPU)"
        assert rows["iperf3"].detail.startswith("iperf 3.")
        assert rows["disk"].detail.endswith(" GiB free in ~/.homegpu")
        # The address its SSH connection reached: the node's own on the LAN.
        assert rows["address"].detail == f"{cpu_only_node3.node(node).address} is private"
        assert rows["tensorflow"].detail.startswith("TensorFlow 2.21.")
        peers = ", ".join(name for name in ("node1", "node2", "node3") if name != node)
        assert rows["reachable"].detail.endswith(f" answers {peers}")


async def test_a_python_without_tensorflow_and_a_firewalled_job_port_are_named(cpu_only_node3, cluster_toml):
    port = free_job_port()
    with cpu_only_node3.node("node2").firewall(port):
        report = await doctor(cluster_toml, port)
    tensorflow = report["node1"]["tensorflow"]
    assert tensorflow.ok is False and tensorflow.detail == "TensorFlow and tf-keras not installed for python3"
    assert "python3 -m pip install 'tensorflow==2.21.*' 'tf-keras==2.21.*'" in tensorflow.fix
    reach = report["node2"]["reachable"]
    assert reach.ok is False, reach
    assert reach.detail.startswith(f"node1, node3 cannot reach node2's job port {cpu_only_node3.node('node2').address}")
    assert f"sudo ufw allow {port}/tcp" in reach.fix
    assert report["node1"]["reachable"].ok is True and report["node3"]["reachable"].ok is True


async def test_replayed_gpus_without_nvml_are_reported_as_a_disagreement(replaying_node3, tmp_path):
    report = await doctor(with_tensorflow(replaying_node3, tmp_path / "cluster.toml"), free_job_port())
    gpus = report["node3"]["gpus"]
    assert gpus.ok is False
    assert "NVIDIA H100 NVL" in gpus.detail and "2 GPUs" in gpus.detail
    if nvml_loads_here():  # a machine with a real driver: its own GPUs are not the recorded ones
        assert "NVML sees" in gpus.detail and "mismatch" in gpus.fix.lower()
    else:
        assert "NVML does not load" in gpus.detail and "nvidia-smi" in gpus.detail
        assert "libnvidia-ml" in gpus.fix
    for node in ("node1", "node2"):  # the other nodes are not affected
        assert report[node]["gpus"].ok is True
    assert all(row.ok is not False for name, row in report["node3"].items() if name != "gpus")


def test_unreachable_node_fails_ssh_skips_the_rest_and_cli_exits_1(cpu_only_node3, tmp_path):
    toml = with_tensorflow(cpu_only_node3, tmp_path / "cluster.toml", node_overrides={"node2": {"host": "127.0.0.99"}})
    port = str(free_port("127.0.0.2"))
    as_json = homegpu("--config", str(toml), "doctor", "--json", "--port", port, cwd=tmp_path)
    text = homegpu("--config", str(toml), "doctor", "--port", port, cwd=tmp_path)
    assert as_json.returncode == 1 and text.returncode == 1, as_json.stderr + text.stderr
    rows = json.loads(as_json.stdout)["checks"]
    node2 = {row["name"]: row for row in rows if row["node"] == "node2"}
    assert node2["ssh"]["ok"] is False and "127.0.0.99" in node2["ssh"]["detail"] and node2["ssh"]["fix"]
    assert all(row["ok"] is None and row["detail"] == NOT_REACHABLE
               for name, row in node2.items() if name != "ssh")
    others = [row for row in rows if row["node"] != "node2" and row["name"] in MUST_PASS]
    assert others and all(row["ok"] is True for row in others), others
    lines = text.stdout.splitlines()
    assert lines[lines.index("node2 (127.0.0.99, runtime process)") + 1].startswith("  ✗ ssh: ")
    assert "— fix: " in text.stdout and "  ✓ python3: Python 3." in text.stdout
    assert lines[-1] == "1 problem on node2"


async def test_unknown_host_keys_fail_with_the_trust_command(cpu_only_node3, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    toml = cpu_only_node3.write_cluster_toml(tmp_path / "cluster.toml", known_hosts=str(empty))
    report = await doctor(toml, free_port("127.0.0.2"))
    for node, rows in report.items():
        assert rows["ssh"].ok is True
        assert rows["host key"].ok is False and "not in known_hosts" in rows["host key"].detail
        assert rows["host key"].fix.startswith("If that is the node's key, run: homegpu")
        assert rows["host key"].fix.endswith(f"trust {node}")
        assert rows["python3"].ok is None and rows["python3"].detail == NOT_REACHABLE


async def test_docker_runtime_reports_the_engine_version(docker_engine, cpu_only_node3, tmp_path):
    toml = cpu_only_node3.write_cluster_toml(tmp_path / "cluster.toml", runtime="docker")
    version = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    assert version, "the docker engine fixture should answer"
    report = await doctor(toml, free_port("127.0.0.2"))
    for node, rows in report.items():
        assert rows["docker"].ok is True and rows["docker"].detail == f"Docker Engine {version}", node
        assert rows["nvidia container runtime"].ok is None
        assert rows["nvidia container runtime"].detail == "not needed (no GPU)"


async def test_port_held_open_fails_the_job_port_check(cpu_only_node3, cluster_toml):
    node1 = cpu_only_node3.node("node1")
    with node1.listening() as port:
        report = await doctor(cluster_toml, port)
    row = report["node1"]["job port"]
    assert row.ok is False
    assert row.detail == f"something listens on {node1.address}:{port}"
    assert "Stop what listens on" in row.fix and "set port in the job" in row.fix
    assert report["node2"]["job port"].ok is True  # the same port on another machine is free


# -- pure judgements ---------------------------------------------------------------------------------


def facts(**changes) -> NodeFacts:
    """A healthy node's facts, with `changes` applied."""
    agent = CommandResult(0, json.dumps({"v": 1, "t": 1.0, "source": "none", "disk_free": 50_000}), "")
    values = dict(
        name="box", runtime="process", python="python3", work_dir="~/.homegpu", address="192.168.1.20",
        port=23456, python_version=CommandResult(0, "3.11.2\n", ""), docker_info=None, nvml=agent,
        smi=agent, iperf3=CommandResult(0, "iperf 3.12 (cJSON 1.7.15)\n", ""),
        clock=(100.0, CommandResult(0, "100.05", ""), 100.1),
        port_probe=CommandResult(0, json.dumps({"status": "free", "ip": "192.168.1.20", "error": ""}), ""),
        tensorflow=CommandResult(0, json.dumps({"tensorflow": "2.21.0", "tf_keras": "2.21.0"}), ""),
    )
    values.update(changes)
    return NodeFacts(**values)


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.2", "loopback"), ("::1", "loopback"),
    ("10.0.0.5", "private"), ("172.16.3.4", "private"), ("192.168.1.20", "private"), ("fd12::1", "private"),
    ("100.101.102.103", "private"),  # CGNAT / Tailscale: not reachable from the internet
    ("169.254.10.1", "link-local"), ("fe80::1", "link-local"),
    ("8.8.8.8", "public"), ("203.0.114.7", "public"), ("2a00:1450:4001::1", "public"),
    ("desktop.local", None),
])
def test_address_kind(address, kind):
    assert address_kind(address) == kind
    assert is_public_address(address) is (kind == "public")


@pytest.mark.parametrize("runtime, found, ok, expected", [
    ("process", {"tensorflow": "2.21.0", "tf_keras": "2.21.0"}, True, "TensorFlow 2.21.0, tf-keras 2.21.0"),
    ("process", {"tensorflow": "2.21.0", "tf_keras": None}, False, "tf-keras not installed for python3"),
    ("process", {"tensorflow": None, "tf_keras": None}, False, "TensorFlow and tf-keras not installed for python3"),
    ("docker", None, None, "not needed here: workers run in the job's image"),
])
def test_tensorflow_check_names_what_is_missing_and_the_install_command(runtime, found, ok, expected):
    result = CommandResult(0, json.dumps(found), "") if found is not None else None
    row = tensorflow_check(facts(runtime=runtime, tensorflow=result), python_ok=True)
    assert (row.ok, row.detail) == (ok, expected)
    if ok is False:
        assert "python3 -m pip install 'tensorflow==2.21.*' 'tf-keras==2.21.*'" in row.fix


def test_public_address_is_a_warning_with_a_fix():
    public = facts(address="8.8.4.4", port_probe=CommandResult(0, json.dumps({"status": "free", "ip": "8.8.4.4"}), ""))
    row = address_check(public)
    assert row.ok is False
    assert "TensorFlow's worker port has no authentication; keep jobs on a trusted LAN" in row.detail
    assert row.fix.startswith("Set address for box in cluster.toml")
    assert address_check(facts()).ok is True


def test_a_host_name_is_judged_by_what_it_resolves_to_on_the_node():
    resolved = facts(address="desktop.example", port_probe=CommandResult(
        0, json.dumps({"status": "free", "ip": "93.184.215.14", "error": ""}), ""))
    row = address_check(resolved)
    assert row.ok is False and "desktop.example (93.184.215.14)" in row.detail
    unresolved = facts(address="desktop.example", port_probe=CommandResult(127, "", "python3: not found"))
    assert address_check(unresolved).ok is None


@pytest.mark.parametrize("sent, remote, received, skew, error", [
    (100.0, 100.5, 101.0, 0.0, 0.5),     # read mid-trip: in step
    (100.0, 105.5, 101.0, 5.0, 0.5),     # node ahead
    (100.0, 97.25, 100.5, -3.0, 0.25),   # node behind
])
def test_clock_skew_compares_with_the_midpoint_of_the_round_trip(sent, remote, received, skew, error):
    assert clock_skew(sent, remote, received) == pytest.approx((skew, error))


@pytest.mark.parametrize("remote, ok", [(100.05, True), (101.9, True), (103.5, False), (96.0, False)])
def test_clock_check_fails_only_beyond_two_seconds(remote, ok):
    row = clock_check(facts(clock=(100.0, CommandResult(0, repr(remote), ""), 100.1)), python_ok=True)
    assert row.ok is ok
    if not ok:
        assert "timedatectl set-ntp true" in row.fix


def test_clock_check_does_not_fail_when_the_round_trip_could_explain_the_skew():
    slow = facts(clock=(100.0, CommandResult(0, "104.6", ""), 105.0))  # 2.1 s off ± 2.5 s
    assert clock_check(slow, python_ok=True).ok is True


@pytest.mark.parametrize("stdout, status, ok", [
    ("3.11.2\n", 0, True), ("3.8.0\n", 0, True), ("3.6.9\n", 0, False), ("2.7.18\n", 0, False), ("", 127, False),
])
def test_python_check(stdout, status, ok):
    row = python_check(facts(python_version=CommandResult(status, stdout, "not found" if status else "")))
    assert row.ok is ok
    if not ok:
        assert 'python = "/path/to/python3"' in row.fix


def test_disk_under_five_gib_fails():
    agent = CommandResult(0, json.dumps({"v": 1, "t": 1.0, "source": "none", "disk_free": 4000}), "")
    row = disk_check(facts(nvml=agent, smi=agent), python_ok=True)
    assert row.ok is False and "3.9 GiB free in ~/.homegpu" in row.detail and "work_dir" in row.fix


def stats(source: str, uuids=(), errors=()) -> object:
    gpus = [{"index": i, "name": "NVIDIA GeForce RTX 3090", "uuid": uuid} for i, uuid in enumerate(uuids)]
    return parse_agent_line(json.dumps({"v": 1, "t": 1.0, "source": source, "gpus": gpus,
                                        "errors": list(errors)}))


def test_gpu_check_agreement_mismatch_and_cpu_only():
    both = gpu_check("box", stats("nvml", ["GPU-a", "GPU-b"]), stats("nvidia-smi", ["GPU-b", "GPU-a"]))
    assert both.ok is True and both.detail == "2 GPUs: 2× NVIDIA GeForce RTX 3090 (NVML and nvidia-smi agree)"
    mismatch = gpu_check("box", stats("nvml", ["GPU-a"]), stats("nvidia-smi", ["GPU-a", "GPU-b"]))
    assert mismatch.ok is False and mismatch.fix.startswith("Driver/library mismatch: reboot")
    none = gpu_check("box", stats("none", errors=["nvml: NVMLError_LibraryNotFound: x"]),
                     stats("none", errors=["nvidia-smi: not found on PATH"]))
    assert none.ok is True and none.detail == "no GPU (CPU-only node: trains on CPU)"


H100 = FIXTURES / "h100-80gb-hbm3"


def h100_agent_line(source: str, **gpu_changes) -> object:
    """The H100's idle reading as recorded there: NVML's from `status --json`, nvidia-smi's CSV."""
    if source == "nvml":
        [node] = json.loads((H100 / "status_idle.json").read_text())["nodes"]
        [gpu] = node["stats"]["gpus"]
    else:
        [gpu] = parse_nvidia_smi_gpus((H100 / "gpus_idle.csv").read_text())
        gpu.pop("driver")
    gpu.update(gpu_changes)
    return parse_agent_line(json.dumps({"v": 1, "t": 1.0, "source": source, "gpus": [gpu]}))


def test_gpu_check_compares_memory_on_the_recorded_h100():
    """Recorded with NVML's version-1 memory info: 480 MiB used at idle where nvidia-smi says 0."""
    smi = h100_agent_line("nvidia-smi")
    v1 = gpu_check("h100", h100_agent_line("nvml"), smi)
    assert v1.ok is True and v1.detail.startswith("1 GPU: 1× NVIDIA H100 80GB HBM3; memory used differs: "
                                                   "GPU 0 480 MiB (NVML), 0 MiB (nvidia-smi)")
    assert "driver's reservation" in v1.detail
    # Version 2 (what the agent reads now) gave used 0, reserved 480 on that machine: they agree.
    v2 = gpu_check("h100", h100_agent_line("nvml", mem_used=0, mem_reserved=480), smi)
    assert (v2.ok, v2.detail) == (True, "1 GPU: 1× NVIDIA H100 80GB HBM3 (NVML and nvidia-smi agree)")
    # A moment apart under load: a few MiB is no disagreement.
    assert "differs" not in gpu_check("h100", h100_agent_line("nvml", mem_used=40), smi).detail


def test_gpu_check_fails_when_memory_sizes_differ():
    row = gpu_check("h100", h100_agent_line("nvml", mem_total=40960), h100_agent_line("nvidia-smi"))
    assert row.ok is False and row.fix.startswith("Driver/library mismatch")
    assert row.detail == ("NVML and nvidia-smi disagree on memory size: "
                          "GPU 0 40960 MiB (NVML), 81559 MiB (nvidia-smi)")


@pytest.mark.parametrize("alone, ok", [(True, None), (False, False)])
def test_missing_iperf3_is_a_note_on_a_one_node_cluster(alone, ok):
    missing = facts(iperf3=CommandResult(127, "", "sh: 1: iperf3: not found"))
    rows = {row.name: row for row in node_checks(missing, alone=alone)}
    assert rows["iperf3"].ok is ok and rows["iperf3"].detail.startswith("iperf3 not found on the node")
    if alone:
        assert "one-node cluster" in rows["iperf3"].detail and "before adding nodes" in rows["iperf3"].detail
    else:
        assert "sudo apt install iperf3" in rows["iperf3"].fix
    present = {row.name: row for row in node_checks(facts(), alone=alone)}
    assert present["iperf3"].ok is True  # found is found, alone or not


def test_gpu_check_without_pynvml_tells_to_install_it_here():
    row = gpu_check("box", stats("none", errors=["nvml: pynvml is not importable"]),
                    stats("nvidia-smi", ["GPU-a"]), containers=True)
    assert row.ok is False and "pip install nvidia-ml-py" in row.fix and "containers" in row.detail


def test_gpu_check_when_nvidia_smi_cannot_reach_the_driver():
    row = gpu_check("box", stats("none", errors=["nvml: NVMLError_DriverNotLoaded: x"]),
                    stats("nvidia-smi", errors=["nvidia-smi query-gpu: exit 9: NVIDIA-SMI has failed"]))
    assert row.ok is False and "reboot" in row.fix


def test_split_reason_separates_what_happened_from_what_to_do():
    unknown = ("host key for 10.0.0.2 port 22 is not in known_hosts (SHA256:abc); "
               "if that is the node's key, run: homegpu trust box")
    assert split_reason(unknown) == ("host key for 10.0.0.2 port 22 is not in known_hosts (SHA256:abc)",
                                     "If that is the node's key, run: homegpu trust box")
    changed = ("HOST KEY CHANGED for h port 22: it now offers SHA256:x, which does not match kh. Refusing to "
               "connect. If the node was reinstalled, remove the old line with `ssh-keygen -f kh -R h`")
    detail, fix = split_reason(changed)
    assert detail.endswith("Refusing to connect") and fix.startswith("If the node was reinstalled")
    assert split_reason("no reason given") == ("no reason given", "")


def test_report_format():
    rows = [Check("box", "ssh", True, "connected to 10.0.0.2"),
            Check("box", "docker", None, 'not needed (runtime "process")'),
            Check("box", "iperf3", False, "iperf3 not found on the node", "Install iperf3.")]
    assert [format_check(row) for row in rows] == [
        "  ✓ ssh: connected to 10.0.0.2",
        '  - docker: not needed (runtime "process")',
        "  ✗ iperf3: iperf3 not found on the node — fix: Install iperf3.",
    ]
    spec = parse_cluster('[[nodes]]\nname = "box"\nhost = "10.0.0.2"\nruntime = "process"\n')
    report = format_report(spec, rows).splitlines()
    assert report[0] == "box (10.0.0.2, runtime process)" and report[-1] == "1 problem on box"


def test_doctor_checks_the_port_the_jobs_use_unless_told():
    nodes = '[[nodes]]\nname = "box"\nhost = "10.0.0.2"\nruntime = "process"\n'
    assert job_port(parse_cluster(nodes)) == 23456
    jobs = '[jobs.zeta]\nport = 24000\n[jobs.alpha]\nport = 22888\n'
    assert job_port(parse_cluster(nodes + jobs)) == 22888
