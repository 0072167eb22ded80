"""Nodes whose login shell is slow or stuck: pyenv's init in ~/.bashrc above any guard (tests/simshell.py).

`pyenvbox` is a real sshd node of its own whose root ~/.bashrc (its own, in its mount namespace) runs a
pyenv-like init for every command sshd hands bash: 0.1 s spent, then `pyenv rehash`'s lock. A lock left
behind by a login cut off makes every later login wait for it (here 8 s rather than pyenv's 60, so the
suite stays quick), then say `pyenv: cannot rehash: PATH exists` and go on.
"""

from __future__ import annotations

import os
import subprocess
from typing import Iterator

import pytest

from simcluster import SimCluster
from simshell import PyenvInit

REHASH_TIMEOUT = 8


@pytest.fixture(scope="module")
def pyenvbox(lan) -> Iterator[SimCluster]:
    """One more real machine, `pyenvbox` at 10.213.0.36 (ssh alias slow-pyenvbox), with pyenv in its ~/.bashrc."""
    sim = SimCluster(0, name="slow")
    sim.add_node("pyenvbox", 36, pyenv=PyenvInit(0.1, rehash_timeout=REHASH_TIMEOUT))
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
