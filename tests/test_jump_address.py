"""The address of a node behind a ProxyJump gateway, from the ssh config and the node's own answers.

The commands that answer (getent, ip route) run for real here, on this machine through the local
transport, standing in for the node: test_proxy_jump.py takes the HostName path on the test LAN.
"""

from __future__ import annotations

import ipaddress

import pytest

from homegpu.remote.config.cluster_spec import parse_cluster
from homegpu.remote.nodes.connect import SSH_CONFIG_VAR, address_behind_jump, ssh_target
from homegpu.remote.nodes.transport import LocalTransport

CLUSTER = '[cluster]\nname = "lab"\n[[nodes]]\nname = "n1"\nhost = "lab-n1"\nruntime = "process"\n'


@pytest.fixture
def ssh_config(tmp_path, monkeypatch):
    def write(hostname: str) -> None:
        path = tmp_path / "ssh_config"
        path.write_text(f"Host lab-n1\n    HostName {hostname}\n    ProxyJump lab-gw\n")
        monkeypatch.setenv(SSH_CONFIG_VAR, str(path))
    return write


async def test_an_address_as_hostname_is_taken_as_it_is(ssh_config):
    ssh_config("10.213.1.2")
    spec = parse_cluster(CLUSTER)
    assert ssh_target(spec, spec.nodes[0]).jump == "lab-gw"
    found = await address_behind_jump(spec, spec.nodes[0], LocalTransport())
    assert found == ("10.213.1.2", "HostName in the ssh config, reached through ProxyJump lab-gw")


async def test_a_name_that_resolves_only_to_loopback_falls_back_to_the_nodes_own_route(ssh_config):
    # /etc/hosts maps localhost to 127.0.0.1 (Debian maps the machine's own name to 127.0.1.1 as well):
    # no other machine reaches that, so the node's source address on its default route is taken.
    ssh_config("localhost")
    spec = parse_cluster(CLUSTER)
    address, source = await address_behind_jump(spec, spec.nodes[0], LocalTransport())
    assert not ipaddress.ip_address(address).is_loopback
    assert source == "the node's own address on its default route, reached through ProxyJump lab-gw"
