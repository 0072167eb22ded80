"""Machines that sleep on the test LAN (tests/simsleep.py): a node's sleep command, run over SSH, takes the
node down but for its wake listener; a magic packet for its own MAC, and only that, brings its sshd back
with the same host key; a node that never wakes; Wake-on-LAN through another node when the controller's
packets are dropped. The harness of issue 36, checked hard: homegpu's own tests of sleep and wake build on it.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator

import asyncssh
import pytest

import simnet
from simcluster import SimCluster, SimNode, alive, own_cluster
from simsleep import BROADCAST, WAKE_PORTS, magic_packet, parse_magic, send_magic

# Starts a process that leaves the SSH session's process tree and prints its pid: sleep must end it too.
DETACHED_SLEEP = "setsid nohup sleep 301 >/dev/null 2>&1 < /dev/null & echo $!"
OTHER_MAC = "02:13:00:00:00:99"


@pytest.fixture
def sleepers(lan) -> Iterator[SimCluster]:
    """Three nodes of their own (10.213.0.90-92); teardown checks that no process of them survived."""
    with own_cluster(3, first_host=90, name="sleepers") as cluster:
        yield cluster


def ssh(cluster: SimCluster, node: SimNode, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run `command` on `node` by its alias, as homegpu reaches it (the cluster's ssh config, strict keys)."""
    argv = ["ssh", "-F", str(cluster.ssh_config_path), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=5", node.alias, command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def iptables_rules(node: SimNode) -> str:
    return subprocess.run(node.in_namespace(["iptables", "-S", "INPUT"]), capture_output=True, text=True,
                          check=True).stdout


# -- magic packets (no LAN) -------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "mac"), [
    (magic_packet("AA:bb:cc:dd:ee:01"), "aa:bb:cc:dd:ee:01"),
    (magic_packet("aa-bb-cc-dd-ee-02"), "aa:bb:cc:dd:ee:02"),
    (b"\x00\x01" + magic_packet("aa:bb:cc:dd:ee:03") + b"pass42", "aa:bb:cc:dd:ee:03"),  # NICs scan the frame
    (b"\xff" + magic_packet("aa:bb:cc:dd:ee:04"), "aa:bb:cc:dd:ee:04"),  # 7 bytes of sync
    (magic_packet("aa:bb:cc:dd:ee:05")[:-1], None),  # the 16th copy cut short
    (b"\xff" * 6 + bytes.fromhex("aabbccddee06") * 15 + bytes.fromhex("aabbccddee07"), None),
    (b"\xfe" * 6 + bytes.fromhex("aabbccddee08") * 16, None),
    (b"", None),
    (b"wake up", None),
])
def test_parse_magic_finds_the_mac_a_magic_packet_wakes(data: bytes, mac: str | None) -> None:
    assert parse_magic(data) == mac


def test_a_magic_packet_is_102_bytes_and_a_bad_mac_is_refused() -> None:
    assert len(magic_packet("aa:bb:cc:dd:ee:ff")) == 102
    with pytest.raises(ValueError):
        magic_packet("aa:bb:cc:dd:ee")


# -- the node's MAC ---------------------------------------------------------------------------------


def test_mac_is_the_one_the_node_itself_sees_and_each_node_has_its_own(sleepers: SimCluster) -> None:
    macs = [node.mac for node in sleepers.nodes]
    assert len(set(macs)) == 3
    for node, mac in zip(sleepers.nodes, macs):
        seen = ssh(sleepers, node, "cat /sys/class/net/eth0/address")
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.strip() == mac and mac == mac.lower() and len(mac.split(":")) == 6
    node = sleepers.nodes[0]
    node.restart()
    assert node.mac == macs[0]  # the same card after a restart


# -- sleep -----------------------------------------------------------------------------------------


def test_the_sleep_command_over_ssh_takes_down_every_process_of_that_node_only(sleepers: SimCluster) -> None:
    node, other = sleepers.nodes[0], sleepers.nodes[1]
    with node.sleepy() as sleeper:
        assert sleeper.cluster_keys == {"mac": node.mac, "sleep_command": sleeper.command}
        detached = int(ssh(sleepers, node, DETACHED_SLEEP).stdout)
        elsewhere = int(ssh(sleepers, other, DETACHED_SLEEP).stdout)
        other_sshd = other.pid
        asked = ssh(sleepers, node, sleeper.command)  # a hang would meet ssh()'s timeout
        assert asked.returncode == 255 and "closed by remote host" in asked.stderr, asked  # dropped, as in a suspend
        sleeper.wait_asleep(timeout=15)
        assert sleeper.asleep and sleeper.sleeps == 1 and not node.is_running
        assert node.pids() == {sleeper.listener_pid}  # all gone but the network card
        assert not alive({detached})
        refused = ssh(sleepers, node, "true")
        assert refused.returncode == 255 and "Connection refused" in refused.stderr
        assert alive({elsewhere, other_sshd}) == {elsewhere, other_sshd}  # the other node sleeps not
        assert ssh(sleepers, other, "true").returncode == 0
        ssh(sleepers, other, f"kill {elsewhere}")
    assert not sleeper.asleep and node.is_running  # the block's end woke it for whoever comes next
    assert ssh(sleepers, node, "true").returncode == 0


async def test_sleep_drops_homegpus_kind_of_connection_at_once(sleepers: SimCluster) -> None:
    node = sleepers.nodes[1]
    with node.sleepy() as sleeper:
        async with asyncssh.connect(node.address, username="root", client_keys=[str(sleepers.client_key_path)],
                                    known_hosts=str(sleepers.known_hosts_path)) as conn:
            idle = await conn.create_process("exec sleep 300")  # a session of its own (an agent's)
            result = await asyncio.wait_for(conn.run(sleeper.command), 5)  # each wait bounds a hang
            assert (result.exit_status, result.exit_signal) == (None, None)  # the command never ended
            await asyncio.wait_for(idle.wait_closed(), 5)
            await asyncio.wait_for(conn.wait_closed(), 5)  # the connection itself is gone
        sleeper.wait_asleep(timeout=15)  # `asleep` turns true once the last process is gone


def test_a_sleep_command_that_returns_and_one_run_on_another_node(sleepers: SimCluster) -> None:
    node, other = sleepers.nodes[0], sleepers.nodes[1]
    with node.sleepy(returns=True) as sleeper:
        wrong = ssh(sleepers, other, sleeper.command)  # the file is reachable there, the node is not
        assert wrong.returncode == 0, wrong.stderr
        time.sleep(0.3)
        assert not sleeper.asleep and sleeper.ignored_requests == [other.marker]
        asked = ssh(sleepers, node, sleeper.command)
        assert asked.returncode == 0, asked.stderr  # as `systemctl suspend --no-block`
        sleeper.wait_asleep(timeout=15)
        assert sleeper.ignored_requests == [other.marker] and other.is_running


# -- wake ------------------------------------------------------------------------------------------


def test_only_a_magic_packet_for_its_own_mac_wakes_it_with_the_same_host_key(sleepers: SimCluster) -> None:
    node = sleepers.nodes[0]
    host_key = node.host_public_key
    with node.sleepy() as sleeper:
        awake_pid = node.pid
        send_magic(node.mac)  # while awake: recorded, nothing happens
        assert sleeper.wait_packets(1)[0] == (simnet.BRIDGE_ADDRESS, 9, node.mac, False)
        assert node.pid == awake_pid and sleeper.wakes == 0
        sleeper.sleep_now()
        send_magic(OTHER_MAC)  # another machine's
        send_magic(node.mac, payload=b"\xff" * 6 + bytes.fromhex(node.mac.replace(":", "")) * 15)  # malformed
        send_magic(OTHER_MAC, node.address, 7)  # unicast, the other port
        packets = sleeper.wait_packets(4)
        # none woke it; ports 9 and 7 are two sockets, so a busy machine may hand over port 7's packet first
        assert Counter(packets[1:]) == Counter([(simnet.BRIDGE_ADDRESS, 9, OTHER_MAC, False),
                                                (simnet.BRIDGE_ADDRESS, 9, None, False),
                                                (simnet.BRIDGE_ADDRESS, 7, OTHER_MAC, False)])
        time.sleep(0.3)
        assert sleeper.asleep and sleeper.wakes == 0 and not node.is_running
        assert ssh(sleepers, node, "true").returncode == 255
        send_magic(node.mac, BROADCAST, 9)
        sleeper.wait_awake(timeout=30)
        assert sleeper.packets[-1] == (simnet.BRIDGE_ADDRESS, 9, node.mac, True) and sleeper.wakes == 1
        assert node.host_public_key == host_key
        back = ssh(sleepers, node, "echo $HOMEGPU_SIMNODE")  # strict checking against the same known_hosts
        assert back.returncode == 0 and back.stdout.strip() == node.marker, back.stderr
        # and it sleeps and wakes again: unicast to port 7 this time
        assert ssh(sleepers, node, sleeper.command).returncode == 255
        sleeper.wait_asleep(timeout=15)
        send_magic(node.mac, node.address, 7)
        sleeper.wait_awake(timeout=30)
        assert (sleeper.sleeps, sleeper.wakes) == (2, 2)
        assert ssh(sleepers, node, "true").returncode == 0


def test_a_node_that_never_wakes_records_its_packets_and_sleeps_on(sleepers: SimCluster) -> None:
    node = sleepers.nodes[2]
    with node.sleepy(wakes=False) as sleeper:
        sleeper.sleep_now()
        for port in WAKE_PORTS:
            send_magic(node.mac, BROADCAST, port)
        assert sleeper.wait_packets(2) == [(simnet.BRIDGE_ADDRESS, 9, node.mac, False),
                                           (simnet.BRIDGE_ADDRESS, 7, node.mac, False)]
        time.sleep(0.5)
        assert sleeper.asleep and sleeper.wakes == 0 and not node.is_running
        assert ssh(sleepers, node, "true").returncode == 255
    assert node.is_running  # the block's end brings it back all the same


def test_wake_via_another_node_when_the_controllers_packets_are_dropped(sleepers: SimCluster) -> None:
    node, relay = sleepers.nodes[0], sleepers.nodes[1]
    before = iptables_rules(node)
    with node.sleepy() as sleeper:
        sleeper.sleep_now()
        with node.drop_wake_packets_from():
            assert simnet.BRIDGE_ADDRESS in iptables_rules(node)
            send_magic(node.mac)
            send_magic(node.mac, node.address, 7)
            time.sleep(0.5)
            assert sleeper.packets == [] and sleeper.asleep  # dropped before the card saw them
            send_magic(node.mac, BROADCAST, 9, namespace=relay.namespace)  # the LAN's broadcast, from the relay
            sleeper.wait_awake(timeout=30)
            assert sleeper.packets == [(relay.address, 9, node.mac, True)]
            assert ssh(sleepers, node, "true").returncode == 0
            ssh(sleepers, node, sleeper.command)
            sleeper.wait_asleep(timeout=15)
            send_magic(node.mac, node.address, 7, namespace=relay.namespace)  # unicast to port 7, from the relay
            sleeper.wait_awake(timeout=30)
            ssh(sleepers, node, sleeper.command)
            sleeper.wait_asleep(timeout=15)
            with pytest.raises(OSError, match="Network is unreachable"):  # no default route on a node
                send_magic(node.mac, "255.255.255.255", 9, namespace=relay.namespace)
            with relay.limited_broadcast_route():  # as `wakeonlan` on a relay whose default route is the LAN
                send_magic(node.mac, "255.255.255.255", 9, namespace=relay.namespace)
                sleeper.wait_awake(timeout=30)
        assert iptables_rules(node) == before
        ssh(sleepers, node, sleeper.command)
        sleeper.wait_asleep(timeout=15)
        send_magic(node.mac)  # the rules gone, the controller's packet wakes it
        sleeper.wait_awake(timeout=30)
        assert [packet.sender for packet in sleeper.packets] == [relay.address] * 3 + [simnet.BRIDGE_ADDRESS]


def test_the_blocks_end_stops_the_listener_and_a_closed_cluster_leaves_nothing(lan) -> None:
    cluster = SimCluster(1, first_host=93, name="insomnia").start()
    node = cluster.nodes[0]
    try:
        with node.sleepy() as sleeper:
            listener = sleeper.listener_pid
            assert listener in node.pids()
        assert not alive({listener}) and sleeper.listener_pid is None
        sleeper = node.sleepy()  # left open, asleep: close() takes it down with the node
        sleeper.sleep_now()
        listener = sleeper.listener_pid
    finally:
        cluster.close()
    assert not alive({listener}) and not cluster.pids()
    sleeper.close()  # finds the node gone: wakes nothing
    assert not node.is_running
