"""Whether this machine is about to sleep: systemd-logind's PrepareForSleep signal, heard through `gdbus monitor`.

A machine that suspends by itself (its desktop's idle timer, a closed lid, the power button) drops its SSH
session without a word. logind says so on the system bus first (PrepareForSleep(true) before, (false) after
waking), to every client that listens, unprivileged ones included, so the agent passes it on and the
controller tells the node asleep, not offline. Only the name's owner, logind itself on a real system bus, is
listened to. Without gdbus (Debian's libglib2.0-bin) or a system bus nothing is heard, and such a node reads
as offline when it sleeps; doctor says so. Where the bus's socket is not there (a container, WSL) gdbus is not
started at all: it would fail after about 45 ms of CPU, on the way to every connection's first lines.

Standard library only, as all of node_side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

if __package__:
    from . import children
else:
    import children

SYSTEM_BUS_SOCKET = "/run/dbus/system_bus_socket"  # where the system bus is when $DBUS_SYSTEM_BUS_ADDRESS is unset
LOGIND = "org.freedesktop.login1"
LOGIND_PATH = "/org/freedesktop/login1"
PREPARE_FOR_SLEEP = "org.freedesktop.login1.Manager.PrepareForSleep"


def monitor_argv(gdbus: str) -> list:
    """gdbus listening to logind's signals on the system bus ($DBUS_SYSTEM_BUS_ADDRESS, else the usual socket)."""
    return [gdbus, "monitor", "--system", "--dest", LOGIND, "--object-path", LOGIND_PATH]


def system_bus_missing(environ=os.environ) -> bool:
    """Whether the system bus gdbus would use is surely not there: its Unix socket path names no file."""
    address = environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=" + SYSTEM_BUS_SOCKET)
    for entry in address.split(";"):  # the addresses to try, in order
        kind, _, keys = entry.partition(":")
        fields = dict(key.partition("=")[::2] for key in keys.split(",") if key)
        if kind != "unix" or "path" not in fields or os.path.exists(fields["path"]):
            return False  # one that may answer (abstract sockets, TCP: not checked here)
    return True


def parse_monitor_line(line: str):
    """True for PrepareForSleep(true) (about to sleep), False for (false) (awake again), None for any other line.

    gdbus prints a signal as ``/org/freedesktop/login1: org.freedesktop.login1.Manager.PrepareForSleep (true,)``.
    """
    head, found, arguments = line.partition(PREPARE_FOR_SLEEP)
    if not found or not head.rstrip().endswith(":"):
        return None
    arguments = arguments.strip()
    if arguments.startswith("(true"):
        return True
    if arguments.startswith("(false"):
        return False
    return None


class SleepWatch:
    """Listens for logind's word in a thread; ``going`` says whether the machine is on its way to sleep.
    ``changed`` is set on each change, so the agent can tell the controller at once, not at its next beat."""

    def __init__(self) -> None:
        self.going = False
        self.changed = threading.Event()

    def start(self) -> bool:
        """Start listening; whether anything can be heard (gdbus is there and started)."""
        gdbus = shutil.which("gdbus")
        if gdbus is None or system_bus_missing():
            return False
        try:
            proc = children.spawn(children.with_death_signal(monitor_argv(gdbus)), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return False
        threading.Thread(target=self._listen, args=(proc,), name="sleep-watch", daemon=True).start()
        return True

    def _listen(self, proc) -> None:
        try:
            for raw in proc.stdout:
                going = parse_monitor_line(raw.decode("utf-8", "replace"))
                if going is not None and going != self.going:
                    self.going = going
                    self.changed.set()
        except (OSError, ValueError):
            pass
        finally:
            children.forget(proc)
            proc.wait()  # no system bus, or the agent is exiting: nothing more to hear
