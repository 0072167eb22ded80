"""A slow or stuck login in words (remote/nodes/login_time.py): pyenv's own messages, bash naming its file."""

from __future__ import annotations

import pytest

from homegpu.remote.nodes.login_time import LoginTiming, login_problem, login_words, rehash_lock, startup_file

LOCK = "/home/me/.pyenv/shims/.pyenv-shim"


@pytest.mark.parametrize("stderr, lock", [
    (f"pyenv: cannot rehash: {LOCK} exists\n", LOCK),  # pyenv 2.3's words after its wait
    (f"pyenv: cannot rehash: couldn't acquire lock {LOCK} for 60 seconds. Last error message:\n"
     f"bash: {LOCK}: cannot overwrite existing file\n", LOCK),  # today's pyenv
    ("pyenv: cannot rehash: /home/me/.pyenv/shims isn't writable\n", ""),  # no lock: a folder it cannot write
    ("", ""),
])
def test_the_rehash_lock_is_read_from_pyenvs_words(stderr, lock):
    assert rehash_lock(stderr) == lock


def test_the_file_is_the_one_bash_names_else_bashrc():
    assert startup_file("/home/me/.profile: line 12: nvm: command not found\n") == "/home/me/.profile"
    assert startup_file("bash: /etc/bash.bashrc: line 3: x: unbound variable\n") == "/etc/bash.bashrc"
    assert startup_file("something else\n") == "~/.bashrc"


def test_a_stale_lock_is_named_with_rm_whether_the_login_ended_or_not():
    said = f"pyenv: cannot rehash: {LOCK} exists\n"
    for timing in (LoginTiming(60.2, said), LoginTiming(None, said, 65)):
        detail, fix = login_problem(timing)
        assert LOCK in detail and fix == f"Remove the stale lock on the node: `rm {LOCK}`"
    assert login_problem(LoginTiming(60.2, said))[0].startswith("its login shell waits 60 s")


def test_slow_stuck_and_quick_logins():
    slow = login_problem(LoginTiming(1.5))
    assert slow[0].startswith("its login shell takes 1.5 s before every command")
    assert "`[[ $- == *i* ]] || return`" in slow[1]
    stuck = login_problem(LoginTiming(None, "", 65))
    assert stuck[0].startswith("its login shell had not run a command after 65 s: something in its ~/.bashrc waits")
    assert login_problem(LoginTiming(0.12)) is None
    assert login_words(LoginTiming(0.12)) == "a command starts 120 ms after its login"
