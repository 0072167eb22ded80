"""A node's login shell that is slow or stuck, in words with the file and the fix, for doctor and preflight.

sshd hands every command to the user's shell (`bash -c`), which reads ~/.bashrc first; pyenv's, conda's
or nvm's init above the file's interactive guard costs each command its time (pyenv's about 0.1 s). A
login cut off while `pyenv rehash` held its lock leaves the lock file, and every later login waits 60 s
for it (`pyenv: cannot rehash: …/.pyenv-shim exists`). A login is timed from the command's start to the
marker it writes once the shell is done (transport.OUTPUT_MARK); what it said on stderr before the
marker names the file or the lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SLOW_LOGIN_S = 0.5  # a login past this is named: homegpu pays it once per connection, people once per ssh
STUCK_LOGIN_S = 5.0  # a login not done after this is stuck (its words while it waits)
# pyenv's rehash waits 60 s (PYENV_REHASH_TIMEOUT) for a held lock, then says so: a login is waited for
# longer than that, so that the lock is named by its path.
LOGIN_TIMEOUT_S = 65.0

GUARD_FIX = ("Put pyenv's, conda's or nvm's init under the interactive guard in the node's {file} (`[[ $- == *i* ]] "
             "|| return` above it), and name the interpreter by its full path in cluster.toml (`python = ...`)")

# pyenv's words for a rehash lock it could not take: older ones `…/.pyenv-shim exists`, newer ones
# `couldn't acquire lock …/.pyenv-shim for 60 seconds`
_REHASH_LOCK = re.compile(r"pyenv: cannot rehash: (?:couldn't acquire lock )?(\S+/\.pyenv-shim)\b")
# bash naming the file it was reading: `/home/me/.bashrc: line 12: …`
_FILE_LINE = re.compile(r"^(?:bash: )?((?:/|~/)\S*(?:rc|profile|\.sh)): line \d+:", re.MULTILINE)


@dataclass(frozen=True)
class LoginTiming:
    """One login, timed: `seconds` until the shell ran the command (None: not yet, after `waited` s), and
    what it wrote to stderr before."""

    seconds: float | None
    stderr: str = ""
    waited: float = 0.0


def without_rehash(said: str) -> str:
    """What a login said, less pyenv's words on its rehash lock (the login time row's, not a talking shell's)."""
    return "".join(line for line in said.splitlines(keepends=True) if not line.startswith("pyenv: cannot rehash:"))


def rehash_lock(stderr: str) -> str:
    """The path of the pyenv rehash lock the login shell waited for, from its stderr ("" when none)."""
    found = _REHASH_LOCK.search(stderr)
    return found.group(1) if found else ""


def startup_file(stderr: str) -> str:
    """The startup file the shell's stderr names (bash's `FILE: line N:`), else ~/.bashrc."""
    found = _FILE_LINE.search(stderr)
    return found.group(1) if found else "~/.bashrc"


def login_problem(timing: LoginTiming) -> tuple[str, str] | None:
    """(what is wrong, the fix) for a slow or stuck login; None for one that is quick."""
    lock = rehash_lock(timing.stderr)
    if lock:
        took = f"{timing.seconds:.0f} s" if timing.seconds is not None else f"over {timing.waited:.0f} s"
        return (f"its login shell waits {took} for every command on pyenv's rehash lock {lock}, left by a login "
                "cut off while pyenv rehashed", f"Remove the stale lock on the node: `rm {lock}`")
    file = startup_file(timing.stderr)
    fix = GUARD_FIX.format(file=file)
    if timing.seconds is None:
        return (f"its login shell had not run a command after {timing.waited:.0f} s: something in its {file} "
                "waits (bash reads it for every command sshd hands it)", fix)
    if timing.seconds > SLOW_LOGIN_S:
        return (f"its login shell takes {timing.seconds:.1f} s before every command (bash reads {file} for each: "
                "an init above its interactive guard?)", fix)
    return None


def login_words(timing: LoginTiming) -> str:
    """What a login took, for a row that is fine."""
    if timing.seconds is None:
        return f"not done after {timing.waited:.0f} s"
    return f"a command starts {timing.seconds * 1000:.0f} ms after its login"
