"""A lab behind a gateway: machines the controller reaches only through ProxyJump, on a LAN of their own.

`lab` is three real sshd machines: `gw` (10.213.0.35, with a second leg at 10.213.1.1 on the lab LAN) and
`n1`, `n2` (10.213.1.2 and .3: LAN 0's addresses, tests/simnet.py), which this machine cannot reach at all:
its ssh config says `ProxyJump lab-gw` for them, as a lab's ~/.ssh/config does. The workers' TF_CONFIG,
the reach check, iperf3 and the run all go between the machines themselves, so each must carry the
address the others reach it by (the ssh config's HostName), never an alias only this machine's ssh config
knows.
"""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys
from typing import Iterator

import docker
import pytest
import tomli_w
from helpers import homegpu, job_table

import simnet
from simcluster import SimCluster, free_job_port
from simdocker import image_id, own_engines

GATEWAY_HOST = 35
LAB_ADDRESSES = {"n1": simnet.address_of(2, simnet.LAB), "n2": simnet.address_of(3, simnet.LAB)}


@pytest.fixture(scope="module")
def lab(lan) -> Iterator[SimCluster]:
    sim = SimCluster(0, name="lab")
    gateway = sim.add_node("gw", GATEWAY_HOST, gateway=True)
    sim.add_node("n1", 2, lan=1, jump=gateway)
    sim.add_node("n2", 3, lan=1, jump=gateway)
    with sim:
        yield sim


def lab_config(lab: SimCluster, tmp_path, nodes=("n1", "n2"), runtime="process", **job) -> str:
    """cluster.toml with `nodes` of the lab (by ssh alias, no address) and a job "demo" on them."""
    table = job_table(nodes=list(nodes), **job)
    data = lab.cluster_dict(runtime, jobs={"demo": table})
    data["nodes"] = [node for node in data["nodes"] if node["name"] in nodes]
    path = tmp_path / "cluster.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


def test_the_controller_cannot_reach_the_lab_but_through_the_gateway(lab):
    # no leg on the lab LAN here: its addresses route out by the default route, never to a bridge of the LAN
    route = subprocess.run(["ip", "route", "get", LAB_ADDRESSES["n1"]], capture_output=True, text=True).stdout
    assert "hgsim" not in route, route
    ssh = subprocess.run(["ssh", "-F", str(lab.ssh_config_path), "-o", "BatchMode=yes", "lab-n1", "hostname", "-I"],
                         capture_output=True, text=True, timeout=30)
    assert ssh.stdout.split() == [LAB_ADDRESSES["n1"]], ssh.stderr
    assert f"from {simnet.address_of(simnet.GATEWAY_HOST, simnet.LAB)} port" in lab.node("n1").log_path.read_text()  # the gateway's leg on the lab LAN


async def test_the_ssh_config_is_parsed_once_for_each_node_and_once_for_their_gateway(lab, tmp_path, monkeypatch):
    """Nodes behind a ProxyJump gateway: their config and the gateway's are parsed once each (not for every
    connection, as asyncssh does for the files named to it), and a second cluster's connections parse nothing."""
    import asyncio
    import os

    import asyncssh

    from homegpu.remote.config.cluster_spec import load_cluster
    from homegpu.remote.nodes import connect
    from homegpu.remote.nodes.cluster import Cluster

    parsed, parse = [], asyncssh.config.SSHConfig.parse
    monkeypatch.setattr(asyncssh.config.SSHConfig, "parse",
                        lambda config, path: (parsed.append(path), parse(config, path))[1])
    connect._parsed_ssh_config.cache_clear()
    spec = load_cluster(lab_config(lab, tmp_path))
    after = []
    for _ in range(2):
        async with Cluster(spec, stream_stats=False) as cluster:
            await asyncio.gather(*(cluster.node(name).wait_online(60) for name in ("n1", "n2")))
            for name in ("n1", "n2"):
                assert (await cluster.node(name).run(["hostname", "-I"])).stdout.split() == [LAB_ADDRESSES[name]]
        after.append(len(parsed))
    files = len([path for path in os.environ["HOMEGPU_SSH_CONFIG"].split(os.pathsep) if path])
    assert after == [3 * files, 3 * files]  # n1, n2 and the gateway, each file once


def test_status_and_tfconfig_give_the_nodes_their_own_addresses(lab, tmp_path):
    config = lab_config(lab, tmp_path)
    status = homegpu("--config", config, "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    for node in json.loads(status.stdout)["nodes"]:
        assert node["address"] == LAB_ADDRESSES[node["name"]]
        assert node["address_source"] == "HostName in the ssh config, reached through ProxyJump lab-gw"
    check = homegpu("--config", config, "check")
    n1 = LAB_ADDRESSES["n1"]
    assert f"lab-n1 → {n1} via lab-gw" in check.stdout and f"{n1} (HostName)" in check.stdout, check.stdout
    tfconfig = homegpu("--config", config, "tfconfig", "demo")
    assert tfconfig.returncode == 0, tfconfig.stdout + tfconfig.stderr
    assert "lab-n1" not in tfconfig.stdout.split("TF_CONFIG", 1)[1]
    assert f'"{LAB_ADDRESSES["n1"]}:' in tfconfig.stdout and f'"{LAB_ADDRESSES["n2"]}:' in tfconfig.stdout


def test_doctor_passes_every_row_that_matters_across_the_gateway(lab, tmp_path):
    result = homegpu("--config", lab_config(lab, tmp_path), "doctor")
    print(result.stdout)
    for row in ("ssh", "host key", "login shell", "python3", "iperf3", "job port", "reachable"):
        lines = [line for line in result.stdout.splitlines() if f" {row}:" in line]
        assert len(lines) == 2 and all("✓" in line for line in lines), (row, result.stdout)


def test_bandwidth_is_measured_between_the_lab_machines(lab, tmp_path):
    result = homegpu("--config", lab_config(lab, tmp_path), "bandwidth", "--json", "--seconds", "1", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    links = {(link["src"], link["dst"]): link for link in json.loads(result.stdout)["links"]}
    assert set(links) == {("n1", "n2"), ("n2", "n1")}
    assert all(not link["error"] and link["gbits"] > 0 for link in links.values()), links


def test_a_two_node_training_run_through_the_gateway(lab, tmp_path):
    result = homegpu("--config", lab_config(lab, tmp_path), "run", "demo", "--no-tui", cwd=tmp_path, timeout=400)
    print(result.stdout[-3000:])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "run succeeded" in result.stdout and "generation 2" not in result.stdout


def test_a_gateway_that_is_itself_a_node_runs_with_the_machines_behind_it(lab, tmp_path):
    (tmp_path / "hello.py").write_text("import os; print('TF_CONFIG', os.environ['TF_CONFIG'])\n")
    config = lab_config(lab, tmp_path, nodes=("gw", "n1"), script="hello.py", python=sys.executable,
                        port=free_job_port())
    result = homegpu("--config", config, "run", "demo", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'"{simnet.address_of(GATEWAY_HOST)}:' in result.stdout and f'"{LAB_ADDRESSES["n1"]}:' in result.stdout


def test_image_copy_chains_an_image_between_the_lab_machines(lab, docker_engine, busybox_image, tmp_path):
    # The chain's hops go node to node, to each node's cluster address: 10.213.1.2 → 10.213.1.3 here.
    with own_engines(lab, ["n1", "n2"]) as engines:
        host = docker.DockerClient(base_url=f"unix://{docker_engine.socket_path}")
        source = engines["n1"].client()
        try:
            source.images.load(b"".join(host.images.get(busybox_image).save(named=True)))
            wanted = source.images.get(busybox_image).id
        finally:
            host.close()
            source.close()
        config = lab_config(lab, tmp_path, runtime="docker")
        result = homegpu("--config", config, "image", "copy", busybox_image, "--from", "n1", timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"n2: ok: Loaded image: {busybox_image}" in result.stdout, result.stdout
        assert image_id(engines["n2"].socket_path, busybox_image) == wanted


def test_the_gateways_key_is_verified_like_a_nodes_and_trusted_the_same_way(lab, tmp_path):
    gateway = lab.node("gw")
    known_hosts = tmp_path / "known_hosts"  # the lab machines' keys, not the gateway's
    known_hosts.write_text("".join(node.known_hosts_line + "\n" for node in lab.nodes if node is not gateway))
    config = lab_config(lab, tmp_path)
    text = Path(config).read_text().replace(str(lab.known_hosts_path), str(known_hosts))
    Path(config).write_text(text)
    status = homegpu("--config", config, "status", "--json")
    assert status.returncode == 1
    n1 = next(node for node in json.loads(status.stdout)["nodes"] if node["name"] == "n1")
    assert n1["state"] == "host key unknown", n1
    assert n1["reason"].startswith(f"host key for {gateway.address} port 22 is not in known_hosts"), n1
    assert f"if that is its ProxyJump gateway lab-gw's key, run: homegpu --config {config} trust n1" in n1["reason"]
    trust = homegpu("--config", config, "trust", "n1", "--yes")
    assert trust.returncode == 0, trust.stdout + trust.stderr
    assert gateway.host_public_key in known_hosts.read_text()
    again = homegpu("--config", config, "status", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
