"""Nodes whose login shell is slow or stuck: pyenv's init in ~/.bashrc above any guard (tests/simshell.py).

`pyenvbox` is a real sshd node of its own whose root ~/.bashrc (its own, in its mount namespace) runs a
pyenv-like init for every command sshd hands bash: 0.1 s spent, then `pyenv rehash`'s lock. A lock left
behind by a login cut off makes every later login wait for it (here 8 s rather than pyenv's 60, so the
suite stays quick), then say `pyenv: cannot rehash: PATH exists` and go on. `slowbox` beside it spends
1.5 s in its init: a slow login. Doctor times a login on each and names what is slow or stuck.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import tomli_w
from helpers import homegpu

from simcluster import SimCluster, free_job_port
from simshell import PyenvInit
from homegpu.remote.config.cluster_spec import load_cluster
from homegpu.remote.doctor import Check, diagnose
from homegpu.remote.doctor import probe as doctor_probe
from homegpu.remote.nodes import Cluster

REHASH_TIMEOUT = 8
SCRIPT = "print('trained', flush=True)\n"


@pytest.fixture(scope="module")
def pyenvbox(lan) -> Iterator[SimCluster]:
    """One more real machine, `pyenvbox` at 10.213.0.36 (ssh alias slow-pyenvbox), with pyenv in its ~/.bashrc."""
    sim = SimCluster(0, name="slow")
    sim.add_node("pyenvbox", 36, pyenv=PyenvInit(0.1, rehash_timeout=REHASH_TIMEOUT))
    sim.add_node("slowbox", 37, pyenv=PyenvInit(1.5))
    with sim:
        yield sim


@pytest.fixture
def stale_lock(pyenvbox: SimCluster) -> Iterator[str]:
    """pyenv rehash's lock left on pyenvbox for the test (removed after it); yields its path on the node."""
    node = pyenvbox.node("pyenvbox")
    node.leave_pyenv_lock()
    try:
        yield node.pyenv_lock
    finally:
        node.clear_pyenv_lock()


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
    monkeypatch.setattr(doctor_probe, "LOGIN_TIMEOUT_S", 3.0)  # below the lock's wait: the login is still stuck
    row = (await doctor_rows(pyenvbox, tmp_path, "pyenvbox"))["login time"]
    assert row.ok is False and "had not run a command after 3 s" in row.detail and "~/.bashrc" in row.detail, row
    assert "[[ $- == *i* ]] || return" in row.fix


# -- a run --------------------------------------------------------------------------------------------


def test_a_run_on_a_slow_login_says_so_in_preflight_and_trains(pyenvbox, tmp_path):
    config = node_config(pyenvbox, tmp_path, "slowbox")
    result = homegpu("--config", str(config), "run", "hello", "--no-tui", cwd=tmp_path, timeout=180)
    assert result.returncode == 0 and "trained" in result.stdout, result.stdout + result.stderr
    warned = [line for line in result.stdout.splitlines() if "login shell takes" in line]
    assert len(warned) == 1 and warned[0].startswith("preflight slowbox: ⚠ slowbox: its login shell takes"), warned
    assert "[[ $- == *i* ]] || return" in warned[0]
