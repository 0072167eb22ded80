"""Nodes whose login shell is slow or stuck: pyenv's init in ~/.bashrc above any guard (tests/simshell.py).

`pyenvbox` is a real sshd node of its own whose root ~/.bashrc (its own, in its mount namespace) runs a
pyenv-like init for every command sshd hands bash: 0.1 s spent, then `pyenv rehash`'s lock. A lock left
behind by a login cut off makes every later login wait for it (here 4 s rather than pyenv's 60, so the
suite stays quick), then say `pyenv: cannot rehash: PATH exists` and go on. `slowbox` beside it spends
1.5 s in its init: a slow login; `stuckbox` waits 15 s on a lock, past the first stats' wait; `hungbox`
300 s, past any wait of homegpu's; `noforward`'s sshd forwards no Unix sockets. Doctor times a login on
each and names what is slow or stuck; homegpu's commands pay one login per connection (the relay's start,
nodes/relay.py), not one each, where the node's sshd lets it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w
from helpers import cmdlines, homegpu, wait_until

from simcluster import SimCluster, SimNode, free_job_port
from simshell import PyenvInit
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.doctor import Check, diagnose
from homegpu.remote.doctor import probe as doctor_probe
from homegpu.remote.jobs import job_runtimes
from homegpu.remote.jobs.job_runtimes import JobRuntimes, LaunchError
from homegpu.remote.nodes import Cluster

REHASH_TIMEOUT = 4
STUCK_FOR = 15  # stuckbox's wait on a lock: past status's wait and a run's wait for first stats
HUNG_FOR = 300  # hungbox's: past any wait of homegpu's (an init that never returns, as a hung NFS home)
SCRIPT = "print('trained', flush=True)\n"


class NodeWithoutStreamForwarding(SimNode):
    """A machine whose sshd forwards no Unix sockets (`AllowStreamLocalForwarding no`, as hardened servers set)."""

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_path.read_text().replace("AllowStreamLocalForwarding yes", "AllowStreamLocalForwarding no")
        self.config_path.write_text(text)


@pytest.fixture(scope="module")
def pyenvbox(lan) -> Iterator[SimCluster]:
    """One more real machine, `pyenvbox` at 10.213.0.36 (ssh alias slow-pyenvbox), with pyenv in its ~/.bashrc."""
    sim = SimCluster(0, name="slow")
    sim.add_node("pyenvbox", 36, pyenv=PyenvInit(0.1, rehash_timeout=REHASH_TIMEOUT))
    sim.add_node("slowbox", 37, pyenv=PyenvInit(1.5))
    sim.add_node("stuckbox", 38, pyenv=PyenvInit(0.1, rehash_timeout=STUCK_FOR))
    sim.add_node("hungbox", 41, pyenv=PyenvInit(0.1, rehash_timeout=HUNG_FOR))
    sim.add_node("noforward", 39, NodeWithoutStreamForwarding, pyenv=PyenvInit(0.1))
    with sim:
        yield sim


@pytest.fixture
def stale_lock(pyenvbox: SimCluster) -> Iterator[str]:
    """pyenv rehash's lock left on pyenvbox for the test (removed after it); yields its path on the node."""
    with pyenvbox.node("pyenvbox").stale_pyenv_lock() as lock:
        yield lock


def ssh(sim: SimCluster, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(sim.ssh_argv(sim.node("pyenvbox"), command), capture_output=True, text=True,
                          timeout=REHASH_TIMEOUT + 30)


# -- the harness -------------------------------------------------------------------------------------


def test_every_command_runs_the_pyenv_init_and_leaves_no_lock(pyenvbox):
    node = pyenvbox.node("pyenvbox")
    result = ssh(pyenvbox, 'echo "$PYENV_ROOT"')
    assert result.returncode == 0 and result.stdout == "/root/.pyenv\n", result  # the init ran, above any guard
    assert result.stderr == "" and not node.pyenv_lock_left


def test_a_lock_left_behind_is_waited_for_then_named_and_the_command_runs(pyenvbox, stale_lock):
    result = ssh(pyenvbox, "echo ran")
    assert result.returncode == 0 and result.stdout == "ran\n", result
    assert result.stderr == f"pyenv: cannot rehash: {stale_lock} exists\n"
    assert pyenvbox.node("pyenvbox").pyenv_lock_left  # stale: nobody removes it
    # the node's own shims folder: this machine's (where its own pyenv may live) has no such file
    assert not os.path.exists(stale_lock)


# -- doctor --------------------------------------------------------------------------------------------


def node_config(sim: SimCluster, tmp_path, node: str, **job) -> Path:
    """cluster.toml with `node` of `sim` alone, and a job "hello" of SCRIPT on it (`job`: more of its keys)."""
    data = sim.cluster_dict(jobs={"hello": {"python": sys.executable, "script": "code/hello.py", "nodes": [node],
                                            "port": free_job_port(), "max_restarts": 0, **job}})
    data["nodes"] = [table for table in data["nodes"] if table["name"] == node]
    (tmp_path / "code").mkdir(exist_ok=True)
    (tmp_path / "code" / "hello.py").write_text(SCRIPT)
    config = tmp_path / "cluster.toml"
    config.write_text(tomli_w.dumps(data))
    return config


async def doctor_rows(sim: SimCluster, tmp_path, node: str) -> dict[str, Check]:
    """Doctor's rows for `node` of `sim`, checked alone."""
    config = load_cluster(str(node_config(sim, tmp_path, node)))
    async with Cluster(config, stream_stats=False) as cluster:
        checks = await diagnose(cluster)
    return {check.name: check for check in checks if check.node == node}


async def test_doctor_times_a_quick_login_and_passes_it(pyenvbox, tmp_path):
    row = (await doctor_rows(pyenvbox, tmp_path, "pyenvbox"))["login time"]
    assert row.ok is True and row.detail.startswith("a command starts ") and row.detail.endswith(" ms after its login")


async def test_doctor_names_a_slow_login_with_its_file_and_the_guard(pyenvbox, tmp_path):
    row = (await doctor_rows(pyenvbox, tmp_path, "slowbox"))["login time"]
    assert row.ok is False and "its login shell takes" in row.detail and "~/.bashrc" in row.detail, row
    assert "[[ $- == *i* ]] || return" in row.fix and "~/.bashrc" in row.fix, row


async def test_doctor_names_a_stale_rehash_lock_by_its_path_with_rm(pyenvbox, stale_lock, tmp_path):
    rows = await doctor_rows(pyenvbox, tmp_path, "pyenvbox")
    row = rows["login time"]
    assert row.ok is False and f"pyenv's rehash lock {stale_lock}" in row.detail, row
    assert row.fix == f"Remove the stale lock on the node: `rm {stale_lock}`"


async def test_doctor_names_a_login_stuck_past_its_bound_and_ends(pyenvbox, stale_lock, tmp_path, monkeypatch):
    monkeypatch.setattr(doctor_probe, "LOGIN_TIMEOUT_S", 2.0)  # below the lock's wait: the login is still stuck
    row = (await doctor_rows(pyenvbox, tmp_path, "pyenvbox"))["login time"]
    assert row.ok is False and "had not run a command after" in row.detail and "~/.bashrc" in row.detail, row
    assert "[[ $- == *i* ]] || return" in row.fix


# -- a run --------------------------------------------------------------------------------------------


def test_a_run_on_a_slow_login_says_so_in_preflight_and_trains(pyenvbox, tmp_path):
    config = node_config(pyenvbox, tmp_path, "slowbox")
    result = homegpu("--config", str(config), "run", "hello", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0 and "trained" in result.stdout, result.stdout + result.stderr
    warned = [line for line in result.stdout.splitlines() if "login shell takes" in line]
    assert len(warned) == 1 and warned[0].startswith("preflight slowbox: ⚠ slowbox: its login shell takes"), warned
    assert "[[ $- == *i* ]] || return" in warned[0]


def test_a_run_on_a_stale_lock_names_it_in_preflight_and_trains(pyenvbox, stale_lock, tmp_path):
    config = node_config(pyenvbox, tmp_path, "pyenvbox")
    result = homegpu("--config", str(config), "run", "hello", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0 and "trained" in result.stdout, result.stdout + result.stderr
    warned = [line for line in result.stdout.splitlines() if stale_lock in line]
    assert len(warned) == 1 and warned[0].startswith("preflight pyenvbox: ⚠ pyenvbox: its login shell waits"), warned
    assert warned[0].endswith(f"Remove the stale lock on the node: `rm {stale_lock}`")


@pytest.fixture
def stuck(pyenvbox: SimCluster) -> Iterator[str]:
    """stuckbox's logins wait STUCK_FOR seconds on a lock for the test; yields the lock's path."""
    with pyenvbox.node("stuckbox").stale_pyenv_lock() as lock:
        yield lock


def test_status_says_the_login_is_stuck_and_a_run_waits_it_out_and_names_the_lock(pyenvbox, stuck, tmp_path):
    config = str(node_config(pyenvbox, tmp_path, "stuckbox"))
    status = homegpu("--config", config, "status", timeout=60)
    assert "(waiting for stats: its login shell had not run a command after" in status.stdout, status.stdout
    assert "~/.bashrc" in status.stdout
    result = homegpu("--config", config, "run", "hello", "--no-tui", cwd=tmp_path, timeout=120)
    assert result.returncode == 0 and "trained" in result.stdout, result.stdout + result.stderr  # not "GPUs not known"
    # while it waits, the run says so, and for how long at most: not a silent minute
    waiting = [line for line in result.stdout.splitlines() if "s more for stuckbox: its login shell had not run" in line]
    assert len(waiting) == 1 and ": waiting up to " in waiting[0] and "~/.bashrc" in waiting[0], result.stdout
    warned = [line for line in result.stdout.splitlines() if "⚠" in line]
    assert len(warned) == 1 and warned[0].startswith("preflight stuckbox: ⚠ stuckbox: its login shell waits "), warned
    assert warned[0].endswith(f"s for every command on pyenv's rehash lock {stuck}, left by a login cut off while "
                              f"pyenv rehashed. Remove the stale lock on the node: `rm {stuck}`"), warned


async def test_a_run_on_a_login_stuck_past_its_bound_is_refused_naming_the_login(pyenvbox, tmp_path, monkeypatch):
    """A login still stuck once pyenv's own 60 s are past (LOGIN_TIMEOUT_S, here 2 s) refuses the run in one line
    naming the login and its fix, not "its GPUs are not known"; the run starts nothing."""
    monkeypatch.setattr(job_runtimes, "LOGIN_TIMEOUT_S", 2.0)
    config = load_cluster(str(node_config(pyenvbox, tmp_path, "hungbox")))
    with pyenvbox.node("hungbox").stale_pyenv_lock():
        async with Cluster(config) as cluster:
            with pytest.raises(LaunchError) as refused:
                await JobRuntimes.open(cluster, config.jobs["hello"])
    said = str(refused.value)
    assert said.startswith("hungbox: its login shell had not run a command after ") and "\n" not in said, said
    assert "something in its ~/.bashrc waits" in said and "[[ $- == *i* ]] || return" in said, said


# -- not paying the login per command --------------------------------------------------------------------


async def test_commands_after_the_first_pay_no_login(pyenvbox, tmp_path):
    """Once the relay runs, a lock every login would wait 4 s for holds no command: each is given 2 s."""
    node = pyenvbox.node("pyenvbox")
    async with Cluster(load_cluster(str(node_config(pyenvbox, tmp_path, "pyenvbox"))), stream_stats=False) as cluster:
        session = cluster.node("pyenvbox")
        await session.wait_online(30)
        assert (await session.run(["echo", "first"], timeout=60)).stdout == "first\n"
        assert session.last_login is not None and session.last_login.seconds >= 0.1  # the relay's start paid it
        with node.stale_pyenv_lock():
            for index in range(5):
                argv = ["sh", "-c", f"echo {index}; echo e >&2; exit 3"]
                result = await session.run(argv, timeout=REHASH_TIMEOUT / 2)
                assert (result.exit_status, result.stdout, result.stderr) == (3, f"{index}\n", "e\n")
            process = await session.spawn(["cat"])
            process.write(b"through the relay\n")
            process.close_stdin()
            assert [line async for line in process.lines()] == ["through the relay"]
            assert await process.wait() == 0
        assert session.transport.relay_trouble == ""


async def test_without_unix_socket_forwarding_commands_pay_the_login_and_work(pyenvbox, tmp_path):
    async with Cluster(load_cluster(str(node_config(pyenvbox, tmp_path, "noforward"))), stream_stats=False) as cluster:
        session = cluster.node("noforward")
        await session.wait_online(30)
        for _ in range(2):
            assert (await session.run(["echo", "by login"], timeout=60)).stdout == "by login\n"
        assert "AllowStreamLocalForwarding" in session.transport.relay_trouble


def relay_pids(node: SimNode) -> list[int]:
    """The node's relays (node_side/scripts/command_relay.py, run as `python3 -c SOURCE`)."""
    return [pid for pid, argv in cmdlines(node.pids()).items()
            if len(argv) > 2 and argv[1] == b"-c" and b"homegpu-relay-" in argv[2]]


async def test_a_relay_that_ends_is_started_again_and_relays_end_with_their_connection(pyenvbox, tmp_path):
    node = pyenvbox.node("pyenvbox")
    async with Cluster(load_cluster(str(node_config(pyenvbox, tmp_path, "pyenvbox"))), stream_stats=False) as cluster:
        session = cluster.node("pyenvbox")
        await session.wait_online(30)
        await session.run(["true"], timeout=60)
        (first,) = relay_pids(node)
        left = os.path.dirname(session.transport.relay_socket)  # a relay killed leaves its folder: removed below
        os.kill(first, signal.SIGKILL)
        assert (await session.run(["echo", "still"], timeout=60)).stdout == "still\n"  # by login, or a new relay
        await session.run(["true"], timeout=60)
        with node.stale_pyenv_lock():  # a new relay: no login paid
            assert (await session.run(["echo", "again"], timeout=REHASH_TIMEOUT / 2)).stdout == "again\n"
        (second,) = relay_pids(node)
        assert second != first and session.transport.relay_trouble == ""
        shutil.rmtree(left)
        folder = os.path.dirname(session.transport.relay_socket)
    await wait_until(lambda: not relay_pids(node), 30, "the relay to end with its connection")
    assert not os.path.exists(folder)  # the node's /tmp is this machine's
