"""The simulated cluster itself: real sshd nodes, each a machine of its own on a shaped LAN, reachable
by ssh alias with strict host key checking; node lifecycle (stop, restart, crash, freeze, new host
key), the link (speed, cut, restore), Docker and iperf3 as later tests use them.

If these fail, every cluster test after them is meaningless, so they check the harness hard.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import docker
import pytest
from helpers import homegpu

import simnet
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.nodes.cluster import Cluster
from simdocker import DockerEngine
from simcluster import NODE_HOME, SimCluster, SimNode, alive, iperf3_between, ssh_banner


# Starts a process that leaves the SSH session's process tree (as a job runner's would) and
# prints its pid; stopping a node must still end it.
DETACHED_SLEEP = "setsid nohup sleep 301 >/dev/null 2>&1 < /dev/null & echo $!"


async def connect(cluster: SimCluster, node: SimNode, **options) -> asyncssh.SSHClientConnection:
    """An asyncssh connection as homegpu makes it: key auth, the test known_hosts, strict."""
    return await asyncssh.connect(
        node.address, port=node.port, username="root", client_keys=[str(cluster.client_key_path)],
        known_hosts=str(cluster.known_hosts_path), connect_timeout=5, **options)


def ssh(cluster: SimCluster, node: SimNode, command: str) -> subprocess.CompletedProcess:
    """Run `command` on `node` with the system OpenSSH client."""
    return subprocess.run(cluster.ssh_argv(node, command), capture_output=True, text=True, timeout=30)


@pytest.fixture
def spare(lan) -> Iterator[SimCluster]:
    """A one-node cluster of its own (10.213.0.20) for tests that stop, crash or re-key it."""
    with SimCluster(1, first_host=20, name="spare") as cluster:
        yield cluster


@pytest.fixture
def pair(lan) -> Iterator[SimCluster]:
    """Two nodes of their own (10.213.0.21-22) for tests that reshape or cut links."""
    with SimCluster(2, first_host=21, name="pair") as cluster:
        yield cluster


def gbits(report: dict) -> float:
    return report["end"]["sum_received"]["bits_per_second"] / 1e9


# -- reaching the nodes ----------------------------------------------------------------------------


def test_every_node_answers_the_system_ssh_client(sim_cluster: SimCluster) -> None:
    procs = [subprocess.Popen(sim_cluster.ssh_argv(node, "true && hostname && echo $HOMEGPU_SIMNODE"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for node in sim_cluster.nodes]
    for node, proc in zip(sim_cluster.nodes, procs):
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{node}: {err}"
        assert out.split()[-1] == node.marker  # reached this node's sshd, not another one


async def test_every_node_answers_asyncssh_with_strict_host_keys(sim_cluster: SimCluster) -> None:
    async def echo(node: SimNode) -> tuple[str, str]:
        async with await connect(sim_cluster, node) as conn:
            result = await conn.run("echo ok; echo $HOMEGPU_SIMNODE", check=True)
            return node.marker, result.stdout

    for marker, stdout in await asyncio.gather(*(echo(node) for node in sim_cluster.nodes)):
        assert stdout == f"ok\n{marker}\n"


async def test_asyncssh_refuses_a_node_whose_key_is_not_known(sim_cluster: SimCluster,
                                                              tmp_path: Path) -> None:
    node1, node2 = sim_cluster.nodes[:2]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{node1.address} {node2.host_public_key}\n")  # node2's key under node1's name
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await asyncssh.connect(node1.address, port=node1.port, username="root",
                               client_keys=[str(sim_cluster.client_key_path)], known_hosts=str(wrong))


async def test_extra_path_is_on_path_of_exec_commands_on_that_node_only(sim_cluster: SimCluster) -> None:
    node3 = sim_cluster.node("node3")
    assert node3.extra_path is not None and sim_cluster.node("node1").extra_path is None
    probe = node3.extra_path / f"probe-{uuid.uuid4().hex[:8]}"
    probe.write_text("#!/bin/sh\necho probe-ran\n")
    probe.chmod(0o755)
    try:
        async with await connect(sim_cluster, node3) as conn:
            path = (await conn.run("printenv PATH", check=True)).stdout.strip()
            found = await conn.run(f"command -v {probe.name} && {probe.name}", check=True)
        assert str(node3.extra_path) in path.split(":")
        assert found.stdout == f"{probe}\nprobe-ran\n"
        assert str(node3.extra_path) in ssh(sim_cluster, node3, "echo $PATH").stdout.strip().split(":")
        async with await connect(sim_cluster, sim_cluster.node("node1")) as conn:
            assert (await conn.run(probe.name)).exit_status == 127  # not found elsewhere
    finally:
        probe.unlink()


# -- cluster.toml ----------------------------------------------------------------------------------


def test_cluster_toml_names_nodes_by_ssh_alias_as_users_write_it(sim_cluster: SimCluster,
                                                                   cluster_toml: Path) -> None:
    spec = load_cluster(cluster_toml)
    assert spec.name == "testcluster"
    assert (spec.ssh.user, spec.ssh.identity_file) == (None, None)  # from the ssh config
    assert spec.ssh.known_hosts == str(sim_cluster.known_hosts_path)
    ssh_settings = spec.ssh.connect_timeout, spec.ssh.keepalive_interval, spec.ssh.keepalive_count_max
    assert ssh_settings == (5.0, 1.0, 3)
    assert spec.work_dir == "~/.homegpu"
    assert [(n.name, n.host, n.port, n.address, n.runtime, n.work_dir) for n in spec.nodes] == [
        (n.name, n.name, None, "", "process", "") for n in sim_cluster.nodes]
    config = sim_cluster.ssh_config_path.read_text()
    for node in sim_cluster.nodes:
        assert f"Host {node.name}\n    HostName {node.address}\n" in config
    assert str(sim_cluster.ssh_config_path) in os.environ["HOMEGPU_SSH_CONFIG"].split(os.pathsep)


async def test_homegpu_reaches_nodes_by_alias_and_takes_the_address_ssh_reached(
        sim_cluster: SimCluster, cluster_toml: Path) -> None:
    spec = load_cluster(cluster_toml)
    async with Cluster(spec, stream_stats=False) as cluster:
        resolved = await cluster.resolve_addresses()
        for node in sim_cluster.nodes:
            assert resolved[node.name] == (node.address, f"reached by ssh {node.name}")
            result = await cluster.node(node.name).run(["sh", "-c", "echo $HOMEGPU_SIMNODE"])
            assert result.stdout.strip() == node.marker


async def test_the_ssh_config_is_parsed_once_per_node_however_many_connections_follow(
        sim_cluster: SimCluster, cluster_toml: Path, monkeypatch) -> None:
    """asyncssh parses the ssh config files for every connection it is told their names for; homegpu parses them
    once per node (and file version) and hands asyncssh the result: a 16-node first screen spent about 80 ms of
    CPU parsing 16 times. The connections still go where the config says (each node by its alias)."""
    from homegpu.remote.nodes import connect

    parsed, parse = [], asyncssh.config.SSHConfig.parse
    monkeypatch.setattr(asyncssh.config.SSHConfig, "parse",
                        lambda config, path: (parsed.append(path), parse(config, path))[1])
    connect._parsed_ssh_config.cache_clear()
    spec = load_cluster(cluster_toml)
    for _ in range(2):  # two clusters, two connections to each node
        async with Cluster(spec, stream_stats=False) as cluster:
            for node in sim_cluster.nodes:
                await cluster.node(node.name).wait_online(30)
                result = await cluster.node(node.name).run(["sh", "-c", "echo $HOMEGPU_SIMNODE"])
                assert result.stdout.strip() == node.marker
    assert parsed == [sim_cluster.ssh_config_path] * len(sim_cluster.nodes)


async def test_an_unreachable_node_keeps_its_configured_host_and_says_so(sim_cluster: SimCluster,
                                                                         tmp_path: Path) -> None:
    path = sim_cluster.write_cluster_toml(tmp_path / "c.toml", node_overrides={"node2": {"host": "127.0.0.99"}})
    async with Cluster(load_cluster(path), stream_stats=False) as cluster:
        resolved = await cluster.resolve_addresses(["node1", "node2"])
    assert resolved == {"node1": (sim_cluster.node("node1").address, "reached by ssh node1"),
                        "node2": ("127.0.0.99", "host 127.0.0.99, not resolved: no SSH connection yet")}


def test_cluster_toml_overrides(sim_cluster: SimCluster, tmp_path: Path) -> None:
    path = sim_cluster.write_cluster_toml(
        tmp_path / "c.toml", runtime="docker", connect_timeout=2, known_hosts=None,
        node_overrides={"node2": {"runtime": "process", "tags": ["gpu"]}},
        jobs={"train": {"script": "train.py"}})
    spec = load_cluster(path)
    assert [n.runtime for n in spec.nodes] == ["docker", "process", "docker"]
    assert spec.node("node2").tags == ("gpu",)
    assert spec.ssh.connect_timeout == 2.0
    assert spec.ssh.known_hosts == "~/.ssh/known_hosts"  # removed, so homegpu's default
    assert spec.jobs["train"].script == "train.py"


# -- node lifecycle --------------------------------------------------------------------------------


def test_stopped_node_refuses_connections_and_restarted_node_answers(spare: SimCluster) -> None:
    node = spare.nodes[0]
    assert ssh(spare, node, "true").returncode == 0
    node.stop()
    assert not node.is_running and not node.pids()
    refused = ssh(spare, node, "true")
    assert refused.returncode == 255 and "Connection refused" in refused.stderr
    node.restart()
    assert ssh(spare, node, "true").returncode == 0


async def test_kill_drops_open_connections_and_ends_all_sessions(spare: SimCluster) -> None:
    node = spare.nodes[0]
    conn = await connect(spare, node)
    session = await conn.create_process("echo $$; exec sleep 300")
    attached = int(await session.stdout.readline())
    detached = int((await conn.run(DETACHED_SLEEP, check=True)).stdout)
    before = node.pids()
    assert {node.pid, attached, detached} <= before and len(before) >= 4  # + the connection's sshd
    node.kill()
    await asyncio.wait_for(conn.wait_closed(), 5)
    await asyncio.wait_for(session.wait_closed(), 5)
    assert not alive(before) and not node.pids()
    with pytest.raises(OSError):
        ssh_banner(node.address, node.port)


async def test_frozen_node_is_silent_until_thawed(spare: SimCluster) -> None:
    node = spare.nodes[0]
    conn = await connect(spare, node, keepalive_interval=0.3, keepalive_count_max=2)
    node.freeze()
    try:
        with pytest.raises(OSError):  # TCP connects (kernel backlog) but no banner comes
            ssh_banner(node.address, node.port, timeout=0.5)
        await asyncio.wait_for(conn.wait_closed(), 5)  # only keepalives notice
    finally:
        node.thaw()
    assert ssh_banner(node.address, node.port).startswith(b"SSH-2.0-")


async def test_new_host_key_is_rejected_until_known_hosts_is_rewritten(spare: SimCluster) -> None:
    node = spare.nodes[0]
    old = node.host_public_key
    assert node.regenerate_host_key() != old
    node.restart()
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await connect(spare, node)
    changed = ssh(spare, node, "true")
    assert changed.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in changed.stderr
    spare.write_known_hosts()
    async with await connect(spare, node) as conn:
        assert (await conn.run("echo ok", check=True)).stdout == "ok\n"


def test_every_node_is_its_own_machine_with_a_private_work_dir(sim_cluster: SimCluster) -> None:
    name = f"mine-{uuid.uuid4().hex[:8]}"
    node1, node2 = sim_cluster.nodes[:2]
    made = ssh(sim_cluster, node1, f"hostname -I && echo hello > ~/.homegpu/{name}")
    assert made.returncode == 0, made.stderr
    assert made.stdout.split() == [node1.address]  # one interface besides lo: its own address
    try:
        assert (node1.work_dir / name).read_text() == "hello\n"  # the test's view of node1's disk
        assert not (Path(NODE_HOME) / ".homegpu" / name).exists()  # the controller's
        assert ssh(sim_cluster, node2, f"test -e ~/.homegpu/{name}").returncode == 1  # another node's
    finally:
        (node1.work_dir / name).unlink()


def test_links_are_shaped_and_a_test_picks_another_speed(pair: SimCluster, iperf3_path: str) -> None:
    first, second = pair.nodes
    assert 0 < gbits(iperf3_between(first, second, iperf3=iperf3_path)) < 1.1  # unshaped: ~10
    first.set_link_speed(100)
    assert 0 < gbits(iperf3_between(first, second, iperf3=iperf3_path)) < 0.11


async def test_a_cut_link_drops_everything_and_restored_open_connections_go_on(pair: SimCluster) -> None:
    node = pair.nodes[0]
    conn = await connect(pair, node)
    try:
        node.cut_link()
        try:
            with pytest.raises(OSError):
                ssh_banner(node.address, node.port, timeout=1.0)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(conn.run("echo during"), 2)
        finally:
            node.restore_link()
        result = await asyncio.wait_for(conn.run("echo after", check=True), 20)
        assert result.stdout == "after\n"  # the same TCP connection survived the cut
    finally:
        conn.close()


def test_close_stops_everything_it_started_and_removes_its_files(lan) -> None:
    cluster = SimCluster(2, first_host=23, name="closing").start()
    try:
        listeners = {node.pid for node in cluster.nodes}
        detached = {int(ssh(cluster, node, DETACHED_SLEEP).stdout) for node in cluster.nodes}
        assert alive(listeners | detached) == listeners | detached
        namespaces = {node.namespace for node in cluster.nodes}
        assert namespaces <= set(simnet._all_namespaces())
    finally:
        cluster.close()
    assert not alive(listeners | detached) and not cluster.pids()
    assert not cluster.root.exists()
    assert not namespaces & set(simnet._all_namespaces())
    assert str(cluster.ssh_config_path) not in os.environ.get("HOMEGPU_SSH_CONFIG", "")


# -- Docker and iperf3 -----------------------------------------------------------------------------


def test_docker_engine_answers_ping(docker_engine: DockerEngine) -> None:
    client = docker.DockerClient(base_url=f"unix://{docker_engine.socket_path}")
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_iperf3_measures_between_two_nodes(sim_cluster: SimCluster, iperf3_path: str) -> None:
    server, client = sim_cluster.nodes[0], sim_cluster.nodes[1]
    report = iperf3_between(server, client, seconds=1, iperf3=iperf3_path)
    connected = report["start"]["connected"][0]
    assert (connected["local_host"], connected["remote_host"]) == (client.address, server.address)
    assert 0 < gbits(report) < 1.1


def test_tfconfig_names_each_node_by_the_address_ssh_reached_and_one_port(sim_cluster: SimCluster,
                                                                           tmp_path: Path) -> None:
    config = sim_cluster.write_cluster_toml(tmp_path / "cluster.toml",
                                            jobs={"demo": {"nodes": ["node1", "node2"], "port": 23456}})
    result = homegpu("--config", str(config), "tfconfig", "demo")
    assert result.returncode == 0, result.stderr
    node1, node2 = sim_cluster.nodes[:2]
    assert f"node1: {node1.address} (reached by ssh node1)" in result.stdout.splitlines()
    endpoints = [f"{node1.address}:23456", f"{node2.address}:23456"]  # the same port on every machine
    assert f'"worker": {json.dumps(endpoints)}' in result.stdout
