"""A simulated node's own ~/.bashrc, as people's machines have it (tests/simcluster.py mounts it).

bash reads ~/.bashrc for every command sshd hands it, so whatever sits above the file's interactive guard
runs before each of homegpu's commands. Two kinds are simulated:

- a line it prints (`login_banner`): an `echo`, a conda or fortune line;
- pyenv's init as its installer puts it there (`PyenvInit`): time spent (`pyenv init -` costs about 0.1 s),
  then `pyenv rehash`'s lock, the prototype shim ~/.pyenv/shims/.pyenv-shim, taken with noclobber and
  removed when done. A login cut off while it holds the lock leaves the file behind, and every later login
  waits for it (pyenv's PYENV_REHASH_TIMEOUT, 60 s), then says `pyenv: cannot rehash: PATH exists` on
  stderr and goes on: `with SimNode.stale_pyenv_lock():` leaves one.

The node's shims folder is a folder of its own, mounted at ~/.pyenv/shims in its mount namespace only, so
this machine's pyenv (if any) and the other nodes never see its lock.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

# HOMEGPU_TEST_LOGIN=pyenv gives every simulated node without a shell of its own pyenv's init (0.1 s a
# login), so the whole suite runs against login shells as people have them: `default_pyenv()`.
LOGIN_ENV = "HOMEGPU_TEST_LOGIN"
PYENV_SHIMS = ".pyenv/shims"  # under the node user's home
PYENV_LOCK = ".pyenv-shim"  # pyenv rehash's prototype shim, its lock


@dataclass(frozen=True)
class PyenvInit:
    """pyenv's init in a node's ~/.bashrc: `seconds` spent each login, then the rehash lock, waited for at
    most `rehash_timeout` seconds when another login holds it (or left it behind)."""

    seconds: float = 0.1
    rehash_timeout: int = 60  # whole seconds, as pyenv counts them ($SECONDS)


# As pyenv-rehash does it: the lock is the prototype shim, created with noclobber; a held lock is tried
# again every 0.1 s until the timeout, then named on stderr, and the login goes on without a rehash.
_PYENV = """\
export PYENV_ROOT="$HOME/.pyenv"
sleep {seconds}
_lock="$PYENV_ROOT/shims/.pyenv-shim"
_start=$SECONDS
until ( set -o noclobber; : > "$_lock" ) 2>/dev/null; do
  if (( SECONDS > _start + {timeout} )); then
    echo "pyenv: cannot rehash: $_lock exists" >&2
    _lock=""
    break
  fi
  sleep 0.1
done
[ -n "$_lock" ] && rm -f "$_lock"
unset _lock _start
"""


def default_pyenv() -> PyenvInit | None:
    """The pyenv init a node gets when its test gives it none: pyenv's own where LOGIN_ENV says `pyenv`."""
    chosen = os.environ.get(LOGIN_ENV, "")
    if chosen not in ("", "pyenv"):
        raise ValueError(f"{LOGIN_ENV}={chosen!r}: give pyenv, or leave it unset for silent login shells")
    return PyenvInit() if chosen == "pyenv" else None


def bashrc(banner: str | None, pyenv: PyenvInit | None) -> str:
    """The text of a node's ~/.bashrc: pyenv's init, then the banner's echo, both above any guard."""
    text = "# a person's ~/.bashrc: everything here runs before any interactive guard\n"
    if pyenv is not None:
        text += _PYENV.format(seconds=f"{pyenv.seconds:g}", timeout=int(pyenv.rehash_timeout))
    if banner is not None:
        text += f"echo {shlex.quote(banner)}\n"
    return text
