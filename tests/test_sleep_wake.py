"""Machines that sleep (issue 36), the parts that need no LAN: the [[nodes]] sleep-and-wake keys and their one-line
errors, the magic packet (the format of AMD's Magic Packet white paper, received here over UDP), the file of
nodes homegpu put to sleep, an asleep node's alerts and queue, what serve counts as needed, and the history's
sleep spells. tests/test_sleep_wake_lan.py wakes and sleeps real sshd nodes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
import socket
import stat
from types import SimpleNamespace

import pytest

from homegpu.remote.alerts.evaluate import AlertEvaluator
from homegpu.remote.config import ConfigError, cluster_to_toml, parse_cluster
from homegpu.remote.config.alert_rules import AlertRules
from homegpu.remote.doctor.sleep_wake import SleepWakeFacts, sleep_wake_check, sleep_wake_facts
from homegpu.remote.sleep_wake import is_progress_tick
from homegpu.remote.sleep_wake.waking import TICK
from homegpu.remote.events import NodeState, NodeStateChanged
from homegpu.remote.history.queries import NodeOffline, OfflineInterval
from homegpu.remote.node_side.scripts import wake_packet
from homegpu.remote.nodes import AsleepNodes, CommandResult
from homegpu.remote.queue import EntryState, NodeView, QueueEntry, decide
from homegpu.tui.cli.history import Report
from homegpu.tui.daemon import nodes_in_use

MAC = "a8:a1:59:0c:22:7e"
T0 = 1_795_316_400.0


def cluster(node_keys: str = "", second: str = "", jobs: str = "") -> str:
    return (f'[cluster]\nname = "home"\n[[nodes]]\nname = "desktop"\nhost = "192.168.1.20"\n{node_keys}\n'
            f'[[nodes]]\nname = "closet"\nhost = "192.168.1.21"\n{second}\n{jobs}')


# --- the keys -------------------------------------------------------------------------------------------

def test_the_sleep_wake_keys_read_as_given_and_by_default() -> None:
    spec = parse_cluster(cluster('mac = "A8-A1-59-0C-22-7E"\nwake_via = "closet"\nsleep_after = "30m"\n'
                                 'sleep_command = "loginctl suspend"\nwake_timeout = 300'))
    keys = spec.node("desktop").sleep_wake
    assert (keys.mac, keys.wake_via, keys.sleep_after, keys.wake_timeout) == (MAC, "closet", 1800.0, 300.0)
    assert keys.sleep_argv(as_root=True) == ["loginctl", "suspend"]
    assert keys.sleep_argv(as_root=False) == ["sudo", "-n", "loginctl", "suspend"]
    plain = spec.node("closet").sleep_wake
    assert (plain.wakeable, plain.sleep_after, plain.sleep_command, plain.wake_timeout) == (
        False, None, "systemctl suspend", 120.0)


def test_the_keys_are_written_back_as_read() -> None:
    spec = parse_cluster(cluster(f'mac = "{MAC}"\nsleep_after = "1h"\nwake_via = "closet"'))
    text = cluster_to_toml(spec)
    assert parse_cluster(text).node("desktop").sleep_wake == spec.node("desktop").sleep_wake
    assert '# mac = "a8:a1:59:0c:22:7e"' in text  # the example, under closet, which has none


@pytest.mark.parametrize("keys, where, words", [
    ('mac = "a8:a1:59:0c:22"', "[[nodes]] #1.mac", "invalid MAC address"),
    ('mac = "a8:a1-59:0c:22:7e"', "[[nodes]] #1.mac", "invalid MAC address"),  # mixed separators
    ('mac = "FF:FF:FF:FF:FF:FF"', "[[nodes]] #1.mac", "is the broadcast address, not a network card's"),
    ('mac = "00-00-00-00-00-00"', "[[nodes]] #1.mac", "is all zeros, not a network card's"),
    ('mac = "01:00:5e:00:00:fb"', "[[nodes]] #1.mac", "is a multicast address (its first byte is odd)"),
    ('sleep_after = "30m"', "[[nodes]] #1.sleep_after", "would sleep but could not be woken: it has no mac"),
    (f'mac = "{MAC}"\nsleep_after = "soon"', "[[nodes]] #1.sleep_after", "is not a duration"),
    (f'mac = "{MAC}"\nsleep_after = "2s"', "[[nodes]] #1.sleep_after",
     "must be from 10 to 604800 seconds (a week), got '2s'"),
    (f'mac = "{MAC}"\nwake_via = "desktop"', "[[nodes]] #1.wake_via", "cannot wake itself"),
    (f'mac = "{MAC}"\nwake_via = "attic"', "[[nodes]] #1.wake_via", "no node 'attic'"),
    ('wake_via = "closet"', "[[nodes]] #1.wake_via", "wake_via without mac"),
    ("sleep_command = \"sh -c 'suspend\"", "[[nodes]] #1.sleep_command", "cannot be split into words"),
    ('sleep_command = "--now"', "[[nodes]] #1.sleep_command", "is not a command"),
    (f'mac = "{MAC}"\nwake_timeout = "2d"', "[[nodes]] #1.wake_timeout",
     "must be from 5 to 3600 seconds (an hour), got '2d'"),
])
def test_a_wrong_sleep_wake_key_is_one_line_naming_it(keys: str, where: str, words: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_cluster(cluster(keys))
    message = str(raised.value)
    assert "\n" not in message and f": {where}: " in message and words in message, message


# --- the magic packet -----------------------------------------------------------------------------------

def test_the_magic_packet_is_six_ff_then_the_mac_sixteen_times() -> None:
    packet = wake_packet.magic_packet("A8-A1-59-0C-22-7E")
    assert len(packet) == 102 and packet[:6] == b"\xff" * 6
    assert packet[6:] == bytes.fromhex("a8a1590c227e") * 16
    with pytest.raises(ValueError):
        wake_packet.magic_packet("a8:a1:59")


def test_the_packet_reaches_a_listener_on_each_port_asked() -> None:
    listeners = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    try:
        for listener in listeners:
            listener.bind(("127.0.0.1", 0))
            listener.settimeout(5)
        ports = tuple(listener.getsockname()[1] for listener in listeners)
        sent, errors = wake_packet.send(MAC, ["127.0.0.1"], ports)
        assert errors == [] and sent == [f"127.0.0.1:{port}" for port in ports]
        assert [listener.recv(200) for listener in listeners] == [wake_packet.magic_packet(MAC)] * 2
    finally:
        for listener in listeners:
            listener.close()


def test_the_broadcast_addresses_end_with_the_limited_one() -> None:
    addresses = wake_packet.broadcast_addresses()
    assert addresses[-1] == "255.255.255.255" and "127.255.255.255" not in addresses  # loopback left out
    assert all(len(address.split(".")) == 4 for address in addresses)


# --- the nodes homegpu put to sleep -----------------------------------------------------------------------

def test_asleep_nodes_are_kept_in_a_private_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    spec = parse_cluster(cluster(f'mac = "{MAC}"'), file=str(tmp_path / "cluster.toml"))
    asleep = AsleepNodes(spec)
    assert asleep.spell("desktop") is None
    asleep.mark("desktop", at=T0)
    assert AsleepNodes(spec).spell("desktop").since == T0 and stat.S_IMODE(asleep.path.stat().st_mode) == 0o600
    asleep.clear("desktop")
    assert asleep.spell("desktop") is None
    asleep.path.write_text("{not json")
    assert asleep.spell("desktop") is None  # damaged: tried as an offline node, not a crash


# --- alerts and the queue ---------------------------------------------------------------------------------

def state(value: NodeState, at: float) -> NodeStateChanged:
    return NodeStateChanged("desktop", value, "", at=T0 + at)


def test_an_asleep_node_is_no_offline_alert_and_clears_one_that_fired() -> None:
    evaluator = AlertEvaluator(AlertRules(node_offline_seconds=60))
    evaluator.take(state(NodeState.ONLINE, 0))
    assert evaluator.take(state(NodeState.ASLEEP, 5)) == []
    assert evaluator.tick(T0 + 500) == []  # asleep all night: nothing
    evaluator.take(state(NodeState.ONLINE, 600))
    evaluator.take(state(NodeState.OFFLINE, 610))
    (fired,) = evaluator.tick(T0 + 700)
    (cleared,) = evaluator.take(state(NodeState.ASLEEP, 720))  # homegpu put it to sleep since
    assert fired.kind == "node_offline" and cleared.state.value == "cleared" and cleared.message == "desktop is asleep"


def test_a_queued_entry_on_an_asleep_node_starts_to_wake_it() -> None:
    entry = QueueEntry(id="q-1", job="train", overrides=(), after=(), priority=0, submitted=T0, user="me",
                       state=EntryState.WAITING)
    nodes = {"desktop": NodeView(NodeState.ASLEEP, None)}
    assert decide([entry], nodes, {"q-1": ("desktop",)}).start == ("q-1",)
    nodes["desktop"] = NodeView(NodeState.OFFLINE, None)
    assert decide([entry], nodes, {"q-1": ("desktop",)}).waits == {"q-1": "node desktop offline"}


def test_serve_keeps_awake_the_nodes_of_runs_on_and_entries_not_ended() -> None:
    spec = parse_cluster(cluster(jobs='[jobs.small]\nnodes = ["closet"]\n[jobs.big]\n'))
    board = SimpleNamespace(runs={"r1": SimpleNamespace(job="small", run_id="small-1")})
    entries = [SimpleNamespace(id="q-3", job="big", state=EntryState.WAITING)]
    store = SimpleNamespace(entries=lambda states: [e for e in entries if e.state in states])
    assert nodes_in_use(spec, board, store) == {"closet": "run small-1 of small is on",
                                                "desktop": "q-3 (big) is waiting"}
    board.runs.clear()
    entries.clear()
    assert nodes_in_use(spec, board, store) == {}


# --- the history ------------------------------------------------------------------------------------------

def test_the_history_tells_sleep_spells_from_offline_ones_and_what_sleep_saved() -> None:
    spec = parse_cluster(cluster(f'mac = "{MAC}"\nidle_watts = 45\n'))
    night = OfflineInterval(T0, T0 + 8 * 3600, "asleep", "put to sleep by homegpu at 22:00", False)
    blip = OfflineInterval(T0 + 9 * 3600, T0 + 9 * 3600 + 30, "offline", "connection lost", False)
    report = Report(spec, None, T0 - 60, T0 + 10 * 3600, None, (), (), (),
                    (NodeOffline("desktop", (night, blip), 8 * 3600 + 30),))
    (line,) = [line for line in report.text().splitlines() if line.startswith("  desktop:")]
    assert line.startswith("  desktop: offline 30 s in 1 interval(s): ")
    assert "; asleep 8 h in 1 interval(s): " in line and "(asleep: put to sleep by homegpu at 22:00)" in line
    assert line.endswith(", saving at least 0.360 kWh (its idle_watts 45 W)")


# --- doctor's row -----------------------------------------------------------------------------------------

def nics_answer(root: bool, gdbus: bool = True) -> CommandResult:
    nics = {"lo": "00:00:00:00:00:00", "enp3s0": MAC}
    return CommandResult(0, json.dumps({"nics": nics, "root": root, "gdbus": gdbus}), "")


def test_doctor_finds_the_mac_among_the_nics_and_asks_sudo_without_sleeping() -> None:
    spec = parse_cluster(cluster(f'mac = "{MAC}"')).node("desktop")
    asked: list[list[str]] = []

    async def run(argv):
        asked.append(list(argv))
        return nics_answer(root=False) if argv[1] == "-c" else CommandResult(0, "/usr/bin/systemctl suspend\n", "")

    facts = asyncio.run(sleep_wake_facts(spec, "alice", "python3", run))
    assert asked[1] == ["sudo", "-n", "-l", "systemctl", "suspend"]  # lists, never runs
    check = sleep_wake_check("desktop", facts)
    assert check.ok is True
    assert check.detail == "mac is enp3s0's; `systemctl suspend` would run through sudo -n, allowed (not run by doctor)"
    deaf = sleep_wake_check("desktop", replace(facts, nics=nics_answer(root=False, gdbus=False)))
    assert deaf.ok is True and deaf.detail.endswith("; without gdbus (libglib2.0-bin) a sleep of its own (a lid, "
                                                    "its idle timer) will read as offline")


def test_doctor_names_a_wrong_mac_and_a_sudo_that_asks_for_a_password() -> None:
    wrong = SleepWakeFacts("02:00:00:00:00:01", "systemctl suspend", "alice", nics_answer(root=True))
    check = sleep_wake_check("desktop", wrong)
    assert check.ok is False and check.detail == f"mac 02:00:00:00:00:01 is none of its NICs' (enp3s0 {MAC})"
    refused = SleepWakeFacts(MAC, "systemctl suspend", "alice", nics_answer(root=False),
                         CommandResult(1, "", "sudo: a password is required\n"))
    check = sleep_wake_check("desktop", refused)
    assert check.ok is False and "sudo does not let alice run `systemctl suspend` without a password" in check.detail
    assert "`alice ALL=(root) NOPASSWD: systemctl suspend`" in check.fix
    assert sleep_wake_check("closet", None).ok is None


def test_a_wakes_progress_ticks_are_told_from_its_steps() -> None:
    """serve's log keeps a wake's steps and leaves out its ticks: the tick is the line _wake_one writes."""
    assert is_progress_tick(TICK.format(node="node1", waited=25.4, timeout=120.0))
    assert is_progress_tick(TICK.format(node="gpu-box.lan", waited=5, timeout=1.5))
    assert not is_progress_tick("waking node1: magic packet for 52:54:00:12:34:56 sent from here to 10.0.0.255")
    assert not is_progress_tick("waking node1: 25 s of up to 120 s, then more")
