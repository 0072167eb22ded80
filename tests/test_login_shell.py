"""Nodes as people have them: a login shell that prints for every command (an `echo` in ~/.bashrc), with
Debian's sftp-server behind it, and sshd's default MaxSessions (10 channels a connection).

`closet` is a real sshd node of its own whose root ~/.bashrc (its own, in its mount namespace) echoes a
line: bash reads it for every command sshd hands it, and sftp-server, started through that shell, sees
its SFTP stream corrupted ("Max packet size exceeded"). Every test node keeps MaxSessions' default.
"""

from __future__ import annotations

import json
import sys
from typing import Iterator

import pytest
import tomli_w
from helpers import homegpu, worker_processes

from simcluster import SimCluster, free_job_port
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.doctor.probe import diagnose
from homegpu.remote.nodes import Cluster

BANNER = "Welcome to the closet box, noisy!"

# Writes TF_CONFIG's index and a file into the output dir, then holds its worker's channels a moment,
# so that all of them are open at once.
SCRIPT = """\
import json, os, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
with open(os.path.join(os.environ["HOMEGPU_OUTPUT_DIR"], f"worker{index}.txt"), "w") as out:
    out.write(f"worker {index}\\n")
print(f"worker {index} of", len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]), flush=True)
time.sleep(3)
"""


@pytest.fixture(scope="module")
def closet(lan) -> Iterator[SimCluster]:
    """One more real machine, `closet` at 10.213.0.34 (ssh alias closet-closet), whose shell talks."""
    sim = SimCluster(0, name="closet")
    sim.add_node("closet", 34, login_banner=BANNER)
    with sim:
        yield sim


def two_node_config(sim_cluster: SimCluster, closet: SimCluster, tmp_path, **job) -> str:
    """cluster.toml with node1 of the shared cluster and closet, and a script job "hello" on both."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(sim_cluster.known_hosts_path.read_text() + closet.known_hosts_path.read_text())
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "hello.py").write_text(SCRIPT)
    table = {"python": sys.executable, "script": "code/hello.py", "nodes": ["node1", "closet"],
             "port": free_job_port(16), "stall_timeout": 120.0, "max_restarts": 0, **job}
    data = sim_cluster.cluster_dict(known_hosts=str(known_hosts), jobs={"hello": table})
    data["nodes"] = [node for node in data["nodes"] if node["name"] == "node1"]
    data["nodes"].append({"name": "closet", "host": closet.node("closet").alias, "runtime": "process"})
    config = tmp_path / "cluster.toml"
    config.write_text(tomli_w.dumps(data))
    return str(config)


def test_status_shows_the_talking_node_online_with_its_stats(sim_cluster, closet, tmp_path):
    result = homegpu("--config", two_node_config(sim_cluster, closet, tmp_path), "status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    nodes = {node["name"]: node for node in json.loads(result.stdout)["nodes"]}
    assert nodes["closet"]["state"] == "online" and nodes["closet"]["stats"]["mem_total"] > 0


async def test_doctor_names_the_banner_once_and_judges_the_rest_right(sim_cluster, closet, tmp_path):
    config = load_cluster(two_node_config(sim_cluster, closet, tmp_path))
    async with Cluster(config, stream_stats=False) as cluster:
        checks = await diagnose(cluster, free_job_port())
    rows = {check.name: check for check in checks if check.node == "closet"}
    shell = rows["login shell"]
    assert shell.ok is False and f"prints `{BANNER}` for non-interactive commands" in shell.detail, shell
    assert "no SFTP (Max packet size exceeded), so homegpu moves files with commands" in shell.detail, shell
    assert "[[ $- == *i* ]]" in shell.fix and "internal-sftp" in shell.fix
    assert rows["ssh"].ok and rows["python3"].ok and rows["clock"].ok and rows["disk"].ok, rows
    assert BANNER not in "".join(row.detail + row.fix for name, row in rows.items() if name != "login shell")
    node1 = {check.name: check for check in checks if check.node == "node1"}
    assert node1["login shell"].ok and node1["login shell"].detail == "prints nothing for non-interactive commands"


def test_a_run_on_the_talking_node_works_and_says_so_once(sim_cluster, closet, tmp_path):
    config = two_node_config(sim_cluster, closet, tmp_path, nodes=["closet", "node1"])  # closet is the chief
    result = homegpu("--config", config, "run", "hello", "--no-tui", cwd=tmp_path, timeout=180)
    print(result.stdout, result.stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    warned = [line for line in result.stdout.splitlines() if BANNER in line]
    assert len(warned) == 1 and warned[0].startswith("preflight closet: ⚠ closet: its login shell prints"), warned
    assert "worker 1 of 2" in result.stdout and "Traceback" not in result.stderr
    (run_dir,) = (tmp_path / "experiments").iterdir()
    assert (run_dir / "output" / "worker0.txt").read_text() == "worker 0\n"  # fetched by tar: no SFTP there
    assert not worker_processes(sim_cluster)


def test_twelve_workers_on_one_node_with_sshds_default_max_sessions_all_run(sim_cluster, closet, tmp_path):
    config = two_node_config(sim_cluster, closet, tmp_path, nodes=["closet"], workers_per_node=12)
    result = homegpu("--config", config, "run", "hello", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "MaxSessions" not in closet.node("closet").config_path.read_text()  # OpenSSH's default, 10
    for index in range(12):
        assert f"worker {index} of 12" in result.stdout, result.stdout
