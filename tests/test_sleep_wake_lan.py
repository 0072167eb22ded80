"""Machines that sleep (issue 36) on the test LAN: `homegpu sleep` and `homegpu wake` as a user runs them, on
nodes whose sleep command takes them down but for a wake listener in their own namespace that brings sshd
back on a magic packet for their MAC (tests/simsleep.py); the state "asleep" in status; a node in use left
awake; a run that wakes its asleep node; Wake-on-LAN through another node when the controller's packets
cannot reach; a node that never wakes, named with the causes.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_replay import FIXTURES, write_replay_nvidia_smi
import test_tui_tmux
from helpers import homegpu, homegpu_argv, job_table, wait_for
from simcluster import SimCluster, alive
from test_queue_lan import serving, submit, wait_state

H100 = FIXTURES / "h100-80gb-hbm3"
terminal_factory = test_tui_tmux.terminal_factory  # the fixture that opens and closes tmux terminals


@pytest.fixture
def house(lan) -> Iterator[SimCluster]:
    """Three machines of their own (10.213.0.100-102), each with its own idle CPUs (not this machine's, which the
    suite keeps busy: tests/simidle.py); node3 replays an H100 with a process on it."""
    cluster = SimCluster(3, first_host=100, name="house", extra_path_nodes=["node3"])
    for node in cluster.nodes:
        node.idle_cpus = True
    cluster.start()
    seen = cluster.pids()
    try:
        write_replay_nvidia_smi(cluster.node("node3").extra_path, H100 / "gpus_load.csv", H100 / "apps_load.csv",
                                version_fixture=H100 / "smi_version.txt")
        yield cluster
        seen |= cluster.pids()
    finally:
        cluster.close()
    assert not (alive(seen) | cluster.pids()), "simulated nodes left processes running"


def config(sim: SimCluster, tmp_path: Path, jobs: dict | None = None, **nodes: dict) -> Path:
    """cluster.toml with each of `nodes` (name=its sleep-and-wake keys) given those keys."""
    return sim.write_cluster_toml(tmp_path / "cluster.toml", node_overrides=nodes, jobs=jobs or {})


def states(config_path: Path, cwd: Path) -> tuple[int, dict[str, dict]]:
    result = homegpu("--config", str(config_path), "status", "--json", cwd=cwd)
    return result.returncode, {node["name"]: node for node in json.loads(result.stdout)["nodes"]}


def test_sleep_then_wake_a_node_and_status_says_asleep_between(house: SimCluster, tmp_path):
    node1 = house.node("node1")
    with node1.sleepy() as sleeper:
        path = config(house, tmp_path, node1=sleeper.cluster_keys)
        slept = homegpu("--config", str(path), "sleep", "node1", cwd=tmp_path)
        assert slept.returncode == 0, slept.stdout + slept.stderr
        assert "node1 is asleep: `homegpu wake node1`" in slept.stdout
        sleeper.wait_asleep()
        code, nodes = states(path, tmp_path)
        assert nodes["node1"]["state"] == "asleep" and nodes["node1"]["reason"].startswith("put to sleep by homegpu at ")
        assert code == 0 and nodes["node2"]["state"] == "online"  # asleep is no fault
        text = homegpu("--config", str(path), "status", cwd=tmp_path).stdout
        assert re.search(r"☾ node1 .*asleep", text), text
        doctor = json.loads(homegpu("--config", str(path), "doctor", "--json", cwd=tmp_path, timeout=180).stdout)
        ssh_row = next(row for row in doctor["checks"] if row["node"] == "node1" and row["name"] == "ssh")
        assert ssh_row["detail"].startswith("asleep (put to sleep by homegpu at ") and "homegpu wake node1" in ssh_row["detail"]

        woke = homegpu("--config", str(path), "wake", "node1", cwd=tmp_path, timeout=180)
        assert woke.returncode == 0, woke.stdout + woke.stderr
        assert f"waking node1: magic packet for {node1.mac} sent from here to " in woke.stdout
        assert re.search(r"^node1 is awake after \d+ s$", woke.stdout, re.M), woke.stdout
        assert sleeper.wakes == 1 and not sleeper.asleep
        assert {packet.mac for packet in sleeper.packets} == {node1.mac}
        code, nodes = states(path, tmp_path)
        assert code == 0 and nodes["node1"]["state"] == "online"
        doctor = json.loads(homegpu("--config", str(path), "doctor", "--json", cwd=tmp_path, timeout=180).stdout)
        rows = {(row["node"], row["name"]): row for row in doctor["checks"]}
        assert rows["node1", "wake and sleep"]["ok"] is True
        assert rows["node1", "wake and sleep"]["detail"].startswith("mac is eth0's; `") and "would run as root" in \
            rows["node1", "wake and sleep"]["detail"]
        assert rows["node2", "wake and sleep"]["ok"] is None  # no mac


def test_a_node_that_sleeps_by_itself_is_asleep_not_offline(house: SimCluster, tmp_path):
    """Its logind says PrepareForSleep on its own system bus (tests/simlogind.py), its agent passes that on to
    the session serve holds, and the dropped connection reads as sleep; a node without a mac stays offline."""
    node1, node2 = house.node("node1"), house.node("node2")
    with node1.sleepy() as sleeper1, node2.sleepy() as sleeper2:
        path = config(house, tmp_path, node1={"mac": sleeper1.mac})  # node2 has no mac: it could not be woken
        log = tmp_path / "serve.log"
        with serving(path, log, tmp_path / "experiments"):
            wait_for(lambda: states(path, tmp_path)[1]["node1"]["state"] == "online", 60, "node1 online")
            sleeper1.sleep_now()
            sleeper2.sleep_now()
            code, nodes = states(path, tmp_path)
            assert nodes["node1"]["state"] == "asleep", nodes["node1"]
            assert re.fullmatch(r"went to sleep by itself at \d\d:\d\d", nodes["node1"]["reason"]), nodes["node1"]
            assert nodes["node2"]["state"] == "offline" and code != 0
            woke = homegpu("--config", str(path), "wake", "node1", cwd=tmp_path, timeout=180)
            assert woke.returncode == 0 and sleeper1.wakes == 1, woke.stdout + woke.stderr
            wait_for(lambda: states(path, tmp_path)[1]["node1"]["state"] == "online", 60, "node1 online again")
        history = homegpu("--config", str(path), "history", "--since", "1h", cwd=tmp_path).stdout
        line = next(line for line in history.splitlines() if line.startswith("  node1:"))
        assert "(asleep: went to sleep by itself at " in line and "offline" not in line, line


def test_a_node_in_use_is_left_awake_with_the_reason(house: SimCluster, tmp_path):
    node3 = house.node("node3")
    with node3.sleepy() as sleeper:
        path = config(house, tmp_path, node3=sleeper.cluster_keys)
        refused = homegpu("--config", str(path), "sleep", "node3", cwd=tmp_path)
        assert refused.returncode == 1
        assert "node3 is not idle: GPU 0 has 1 process (python3); nothing was done" in refused.stderr, refused.stderr
        assert sleeper.sleeps == 0 and not sleeper.asleep
        no_mac = config(house, tmp_path)
        refused = homegpu("--config", str(no_mac), "sleep", "node3", cwd=tmp_path)
        assert refused.returncode == 2 and "node3 has no mac in" in refused.stderr, refused.stderr


def test_a_run_wakes_its_asleep_node_first(house: SimCluster, tmp_path):
    node2 = house.node("node2")
    with node2.sleepy() as sleeper:
        path = config(house, tmp_path, jobs={"demo": job_table()}, node2=sleeper.cluster_keys)
        assert homegpu("--config", str(path), "sleep", "node2", cwd=tmp_path).returncode == 0
        sleeper.wait_asleep()
        run = homegpu("--config", str(path), "run", "demo", "--no-tui", cwd=tmp_path, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"waking node2: magic packet for {node2.mac} sent from here" in run.stdout, run.stdout
        assert sleeper.wakes == 1 and "run succeeded" in run.stdout


def test_wake_via_another_node_when_the_controllers_packets_cannot_reach(house: SimCluster, tmp_path):
    node1, node2 = house.node("node1"), house.node("node2")
    with node1.sleepy() as sleeper, node1.drop_wake_packets_from():
        direct = config(house, tmp_path, node1=sleeper.cluster_keys | {"wake_timeout": "10s"})
        assert homegpu("--config", str(direct), "sleep", "node1", cwd=tmp_path).returncode == 0
        sleeper.wait_asleep()
        failed = homegpu("--config", str(direct), "wake", "node1", cwd=tmp_path, timeout=120)
        assert failed.returncode == 1 and sleeper.asleep
        assert "node1 did not wake within 10 s of its magic packet (sent from here to " in failed.stderr
        assert "set wake_via to a node on its LAN" in failed.stderr and "ethtool" in failed.stderr

        via = config(house, tmp_path, node1=sleeper.cluster_keys | {"wake_via": "node2"})
        woke = homegpu("--config", str(via), "wake", "node1", cwd=tmp_path, timeout=180)
        assert woke.returncode == 0, woke.stdout + woke.stderr
        assert "sent through node2" in woke.stdout
        assert sleeper.wakes == 1 and sleeper.packets_from(node2.address)


def test_a_node_that_never_wakes_is_named_with_the_causes(house: SimCluster, tmp_path):
    with house.node("node1").sleepy(wakes=False) as sleeper:
        path = config(house, tmp_path, node1=sleeper.cluster_keys | {"wake_timeout": "8s"})
        assert homegpu("--config", str(path), "sleep", "node1", cwd=tmp_path).returncode == 0
        sleeper.wait_asleep()
        failed = homegpu("--config", str(path), "wake", "node1", cwd=tmp_path, timeout=120)
        assert failed.returncode == 1 and sleeper.packets  # the packets came; the machine did not
        (line,) = failed.stderr.strip().splitlines()
        assert line.startswith("homegpu: node1 did not wake within 8 s of its magic packet"), line
        assert "Wake-on-LAN must be on in its BIOS/UEFI and on its NIC" in line and "ethtool -s NIC wol g" in line
        assert f"its mac {house.node('node1').mac} must be its wired NIC's (`ip link` on it" in line  # a wrong mac


def test_serve_sleeps_an_idle_node_not_one_in_use_and_its_queue_wakes_it(house: SimCluster, tmp_path,
                                                                         terminal_factory):
    node1, node3 = house.node("node1"), house.node("node3")
    with node1.sleepy() as sleeper1, node3.sleepy() as sleeper3:
        path = config(house, tmp_path, jobs={"demo": job_table(nodes=["node1"])},
                      node1=sleeper1.cluster_keys | {"sleep_after": "10s", "idle_watts": 40},
                      node3=sleeper3.cluster_keys | {"sleep_after": "10s"})  # python3 holds its GPU
        log = tmp_path / "serve.log"
        with serving(path, log, tmp_path / "experiments"):
            sleeper1.wait_asleep(timeout=90)
            wait_for(lambda: "node1 put to sleep after 1" in log.read_text(), 10, "serve to say so")
            assert re.search(r"node1 put to sleep after 1\d s idle \(its sleep_after\)", log.read_text())
            code, nodes = states(path, tmp_path)
            assert nodes["node1"]["state"] == "asleep" and nodes["node3"]["state"] == "online"
            assert sleeper3.sleeps == 0  # someone's process is on its GPU
            term = terminal_factory(shlex.join(homegpu_argv("--config", str(path))), tmp_path, size=(80, 24))
            term.wait_for("☾ node1", 60)
            term.close()

            entry = submit(path, "demo", "--set", "epochs=1")  # the queue wakes node1 and runs there
            done = wait_state(path, entry, "succeeded", timeout=300)
            assert sleeper1.wakes == 1, done
            said = log.read_text()  # serve's log says the queue woke it, its steps without the wait's ticks
            assert f"homegpu serve: queue: {entry} (demo): waking node1: magic packet for {node1.mac} sent " in said, said
            assert not re.search(r"waking node1: \d+ s of up to", said), said
            sleeper1.wait_asleep(timeout=90)  # idle again after the run: back to sleep
        history = homegpu("--config", str(path), "history", "--since", "1h", cwd=tmp_path)
        line = next(line for line in history.stdout.splitlines() if line.startswith("  node1:"))
        assert "asleep " in line and "(asleep: put to sleep by homegpu at " in line and "saving at least" in line, line
