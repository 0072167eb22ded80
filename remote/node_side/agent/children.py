"""The stats agent's child processes (nvidia-smi, gdbus): each noted as it starts, so that ``kill_children``
ends them all when the agent exits, and the long-lived ones tied to the agent's life by the kernel.

Standard library only, Python 3.8+: it runs on the nodes with the agent (see ``stats_agent.py``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

SMI_TIMEOUT_S = 10.0
_CHILDREN = set()  # children running now, killed when the agent exits
_SPAWN_LOCK = threading.Lock()  # makes "start a child and note it" one step for kill_children
_EXITING = threading.Event()  # set by kill_children: no child may start after it


def spawn(argv, **popen_args):
    """Start a child that ``kill_children`` will find; refused once the agent is exiting."""
    with _SPAWN_LOCK:
        if _EXITING.is_set():
            raise OSError("the agent is exiting")
        proc = subprocess.Popen(argv, **popen_args)
        _CHILDREN.add(proc)
    return proc


def forget(proc):
    _CHILDREN.discard(proc)


def kill_children():
    """Kill and reap every child, and let no new one start: nothing may outlive the agent.

    Reaping matters on nodes whose init does not reap orphans (containers): a killed child we did
    not wait for would stay in the process table. The lock is only waited for briefly because this
    also runs from signal handlers, which may interrupt a thread that holds it.
    """
    locked = _SPAWN_LOCK.acquire(timeout=1.0)
    try:
        _EXITING.set()
        procs = list(_CHILDREN)
    finally:
        if locked:
            _SPAWN_LOCK.release()
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.wait(timeout=1.0)


def exiting():
    """Whether ``kill_children`` has run: the agent is on its way out."""
    return _EXITING.is_set()


def run_command(argv, timeout=SMI_TIMEOUT_S):
    """Run ``argv``; return (exit code, stdout, stderr). The child is tracked so an exit kills it."""
    proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        forget(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


# Run in front of the long-lived loop child (``python -c`` it, then it execs nvidia-smi in the same
# process): ask the kernel to SIGKILL the child when the agent dies, even by SIGKILL, which no
# handler of ours sees. A ``preexec_fn`` would do the same without the extra interpreter start,
# but it is not safe in a process with threads, and the agent has two.
_DEATH_SIGNAL_SHIM = """\
import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
except Exception:
    pass  # no ctypes or no prctl: the agent's own exit handling still kills the child
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the agent died before prctl took effect
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it, and exec would keep that
try:
    os.execv(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stdout.write("cannot run %s: %s\\n" % (sys.argv[2], exc))
    sys.exit(127)
"""


def with_death_signal(argv):
    """``argv`` wrapped so its process dies with the agent (Linux; elsewhere ``argv`` as it is)."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _DEATH_SIGNAL_SHIM, str(os.getpid())] + list(argv)
