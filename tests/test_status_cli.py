"""`homegpu status` and `homegpu trust` as a user runs them, against the real sshd nodes."""

from __future__ import annotations

import json
import signal
import subprocess

import pytest
from helpers import homegpu, homegpu_argv

from simcluster import SimCluster



def test_status_json_shows_every_node_online_with_stats(sim_cluster, cluster_toml):
    result = homegpu("--config", str(cluster_toml), "status", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert [node["name"] for node in report["nodes"]] == ["node1", "node2", "node3"]
    for node in report["nodes"]:
        assert node["state"] == "online"
        # named by ssh alias: the address is where the connection went
        assert node["host"] == node["name"] and node["address"] == sim_cluster.node(node["name"]).address
        assert node["address_source"] == f"reached by ssh {node['name']}"
        assert node["stats"]["mem_total"] > 0 and node["stats"]["cpu"] is not None


def test_status_table_and_exit_1_with_a_node_down(sim_cluster, cluster_toml):
    victim = sim_cluster.node("node1")
    victim.stop()
    try:
        result = homegpu("--config", str(cluster_toml), "status")
    finally:
        victim.start()
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    node1 = next(i for i, line in enumerate(lines) if "node1" in line)
    assert "offline" in lines[node1] and "connection refused" in lines[node1 + 1]
    assert any("node2" in line and "online" in line and "cpu" in line for line in lines)


def test_status_watch_keeps_printing_until_interrupted(cluster_toml):
    # Ctrl-C's signal as a terminal delivers it: a suite started in the background (`cmd &` in a script)
    # ignores SIGINT, and its children would inherit that and never see it.
    process = subprocess.Popen(homegpu_argv("--config", str(cluster_toml), "status", "--watch", "--json"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    reports = []
    try:
        while len(reports) < 3:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            reports.append(json.loads(line))
    finally:
        process.send_signal(signal.SIGINT)
        # Read on to the end: a pipe left unread fills (a report with GPU processes is kilobytes) and blocks
        # the writer in write(), where SIGINT's cancellation never gets its turn.
        try:
            _, errors = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            _, errors = process.communicate()
            pytest.fail(f"status --watch did not end within 20 s of SIGINT; its stderr: {errors[-3000:]}")
    assert reports[0]["at"] < reports[1]["at"] < reports[2]["at"]
    assert all(len(report["nodes"]) == 3 for report in reports)


def test_trust_shows_fingerprint_and_adds_the_key(lan, tmp_path):
    with SimCluster(1, first_host=60, name="trusting") as sim:
        sim.known_hosts_path.write_text("")
        config = str(sim.write_cluster_toml(tmp_path / "cluster.toml"))
        refused = homegpu("--config", config, "status")
        assert refused.returncode == 1
        assert "host key unknown" in refused.stdout and f"homegpu --config {config} trust node1" in refused.stdout

        no_tty = homegpu("--config", config, "trust", "node1")
        assert no_tty.returncode == 2 and "--yes" in no_tty.stderr
        assert sim.known_hosts_path.read_text() == ""

        trusted = homegpu("--config", config, "trust", "node1", "--yes")
        assert trusted.returncode == 0, trusted.stderr
        assert "SHA256:" in trusted.stdout
        line = sim.known_hosts_path.read_text()
        assert sim.nodes[0].host_public_key in line
        assert homegpu("--config", config, "status").returncode == 0

        again = homegpu("--config", config, "trust", "node1", "--yes")
        assert again.returncode == 1 and "already trusted" in again.stderr
        assert sim.known_hosts_path.read_text() == line


def test_trust_unknown_node_is_a_clear_error(cluster_toml):
    result = homegpu("--config", str(cluster_toml), "trust", "nodeX", "--yes")
    assert result.returncode == 2
    assert "no node named 'nodeX'" in result.stderr and "node1, node2, node3" in result.stderr
