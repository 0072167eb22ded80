"""Preflight proves the network: every node reaches every worker's address:port (remote/net/reach.py).

The cases run between namespaced sshd nodes of tests/simcluster.py, each its own machine on the
test LAN: a firewall is a real iptables rule in the worker's namespace (DROP as `ufw deny` does,
or REJECT), a wrong address is another node's real address, an unresolvable one a reserved name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tomli_w

from helpers import homegpu, job_table, worker_processes
from simcluster import SimCluster, SimNode, free_job_port

from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.doctor.probe import diagnose
from homegpu.remote.net.reach import Endpoint, describe, reach_problems
from homegpu.remote.nodes.cluster import Cluster



@pytest.mark.parametrize("status, expected", [
    ("timed out", ["node2, node3 cannot reach node1's job port 10.0.0.5:23456", "no answer within 5 s",
                   "sudo ufw allow 23456/tcp"]),
    ("refused", ["connection refused", "firewall on node1 rejects it", "sudo ufw allow 23456/tcp"]),
    ("unresolved", ["cannot resolve node1's address '10.0.0.5' (Name or service not known)",
                    "set address = \"<its LAN IP>\" for node1 in cluster.toml"]),
    ("unreachable", ["has no route to node1's address 10.0.0.5 (No route to host)"]),
    ("other", ["another program answered, not node1", "set node1's address in cluster.toml"]),
])
def test_each_cause_is_named_with_its_fix(status, expected):
    strerror = {"unresolved": "Name or service not known", "unreachable": "No route to host"}.get(status, "")
    text = describe("node2, node3", "node1", "10.0.0.5", 23456, status, strerror)
    for part in expected:
        assert part in text, text
    assert "\n" not in text


async def _problems(config: Path, addresses: dict[str, str] | None = None, port: int | None = None,
                    nodes: tuple[str, ...] = ("node1", "node2", "node3")) -> list:
    spec = load_cluster(config)
    port = port or free_job_port()
    async with Cluster(spec, stream_stats=False) as cluster:
        await cluster.wait_settled(spec.ssh.connect_timeout + 2)
        ends = [Endpoint(session, (addresses or {}).get(name, session.address), (port,))
                for name, session in cluster.nodes.items() if name in nodes]
        return await reach_problems(ends)


async def test_nodes_on_one_lan_reach_each_other(sim_cluster, cluster_toml):
    assert await _problems(cluster_toml) == []


async def test_a_dropping_firewall_is_named_with_node_port_and_fix(sim_cluster, cluster_toml):
    port = free_job_port()
    with sim_cluster.node("node2").firewall(port):
        problems = await _problems(cluster_toml, port=port)
    assert [p.node for p in problems] == ["node2"]
    text = problems[0].text
    assert f"node1, node3 cannot reach node2's job port {sim_cluster.node('node2').address}:{port}" in text
    assert "no answer within 5 s" in text and f"sudo ufw allow {port}/tcp" in text


async def test_a_rejecting_firewall_is_a_refused_connection(sim_cluster, cluster_toml):
    port = free_job_port()
    with sim_cluster.node("node3").firewall(port, "REJECT"):
        problems = await _problems(cluster_toml, port=port)
    assert [p.node for p in problems] == ["node3"]
    assert "connection refused" in problems[0].text


async def test_another_machines_address_is_caught_by_its_secret(sim_cluster, cluster_toml):
    """node2 claims node3's address, where another program holds the port: it answers, without the secret."""
    with sim_cluster.node("node3").listening() as port:
        problems = await _problems(cluster_toml, {"node2": sim_cluster.node("node3").address}, port,
                                   nodes=("node1", "node2"))
    assert [p.node for p in problems] == ["node2"]
    assert "node1 reached" in problems[0].text and "another program answered, not node2" in problems[0].text


async def test_nodes_at_one_address_are_one_machine(sim_cluster, cluster_toml):
    """Two nodes that share an address share a machine: nothing crosses a network between them."""
    assert await _problems(cluster_toml, {"node2": sim_cluster.node("node1").address}, nodes=("node1", "node2")) == []


async def test_a_name_the_peers_cannot_resolve_is_named(sim_cluster, cluster_toml):
    problems = await _problems(cluster_toml, {"node3": "closet.invalid"})
    assert [p.node for p in problems] == ["node3"]
    assert "node1, node2 cannot resolve node3's address 'closet.invalid'" in problems[0].text


async def test_a_port_in_use_on_a_node_is_said_before_any_connect(sim_cluster, cluster_toml):
    with sim_cluster.node("node1").listening() as taken:
        problems = await _problems(cluster_toml, port=taken)
    assert [p.node for p in problems] == ["node1"]
    assert f"node1: job port *:{taken} is in use" in problems[0].text


def test_a_firewalled_job_port_fails_preflight_with_nothing_started(sim_cluster, tmp_path):
    """Refused by the reach proof, before code sync and any start (how long that takes is bench_jobs' reach part)."""
    port = free_job_port()
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml", jobs={"demo": job_table(port=port)})
    with sim_cluster.node("node2").firewall(port):
        result = homegpu("--config", str(config), "run", "demo", "--no-tui", cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"node1 cannot reach node2's job port {sim_cluster.node('node2').address}:{port}" in result.stderr
    assert f"sudo ufw allow {port}/tcp" in result.stderr
    assert "Traceback" not in result.stderr
    assert not worker_processes(sim_cluster)
    assert not any((tmp_path / "experiments").glob("*/logs/*.log"))


class NodeWithoutSftp(SimNode):
    """A machine whose sshd offers no SFTP subsystem (some minimal and hardened servers)."""

    def _write_config(self) -> None:
        super()._write_config()
        lines = self.config_path.read_text().splitlines(keepends=True)
        self.config_path.write_text("".join(line for line in lines if not line.startswith("Subsystem")))


@pytest.fixture(scope="module")
def node_without_sftp(sim_cluster: SimCluster) -> Iterator[SimCluster]:
    """One more real machine, `nosftp` at 10.213.0.33 (ssh alias nosftp-nosftp)."""
    spare = SimCluster(0, name="nosftp")
    spare.add_node("nosftp", 33, NodeWithoutSftp)
    with spare:
        yield spare


async def test_doctor_says_files_go_by_commands_on_a_server_without_sftp(node_without_sftp, tmp_path):
    spare = node_without_sftp.node("nosftp")
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(spare.known_hosts_line + "\n")
    data = node_without_sftp.cluster_dict(known_hosts=str(known_hosts))
    config = tmp_path / "cluster.toml"
    config.write_text(tomli_w.dumps(data))
    async with Cluster(load_cluster(config), stream_stats=False) as cluster:
        rows = {check.name: check for check in await diagnose(cluster, free_job_port())}
        # the node's files all the same: a folder made and listed by commands
        node = cluster.node("nosftp")
        folder = f"{await node.home_dir()}/.homegpu/made-without-sftp/inner"
        await node.makedirs(folder)
        (spare.work_dir / "made-without-sftp" / "inner" / "f").write_text("x")
        listing = await node.list_tree(folder.rsplit("/", 1)[0], frozenset())
    assert rows["ssh"].ok is True and rows["python3"].ok is True
    assert rows["login shell"].ok is True
    assert rows["login shell"].detail == ("prints nothing for non-interactive commands; no SFTP (its SSH server "
                                          "offers no SFTP subsystem), so homegpu moves files with commands")
    assert listing == {"inner/f": (1, listing["inner/f"][1])}
