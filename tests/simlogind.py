"""A simulated machine's system bus with logind's one signal homegpu listens to (node_side/agent/sleep_watch.py).

Each SimNode's sessions get $DBUS_SYSTEM_BUS_ADDRESS naming a socket of the node's own (SimNode.system_bus_address),
as a real machine's point at /run/dbus/system_bus_socket. Nothing listens there unless a test starts a Logind:
a real dbus-daemon on that socket (any user of the node may connect, as on a system bus) and a connection that
owns org.freedesktop.login1, as systemd-logind does, and sends PrepareForSleep(true) before the machine sleeps
and PrepareForSleep(false) once it woke, as logind does. Only the suspend itself is simulated (tests/simsleep.py).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from jeepney import DBusAddress, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import DBusConnection, open_dbus_connection

LOGIND = "org.freedesktop.login1"
MANAGER = DBusAddress("/org/freedesktop/login1", interface="org.freedesktop.login1.Manager")
# Any user may connect and anyone may own a name: the node's sessions run as users of their own.
BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>{address}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


class Logind:
    """A system bus on `socket` with logind's name owned; close() ends both."""

    def __init__(self, socket: Path) -> None:
        self.address = f"unix:path={socket}"
        socket.unlink(missing_ok=True)
        config = socket.with_name(socket.name + ".conf")
        config.write_text(BUS_CONFIG.format(address=self.address))
        self._daemon = subprocess.Popen(["dbus-daemon", f"--config-file={config}", "--nofork"],
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._connection = self._connect(socket)
        reply = self._connection.send_and_get_reply(message_bus.RequestName(LOGIND), timeout=10)
        if reply.body != (1,):  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER
            self.close()
            raise RuntimeError(f"could not own {LOGIND} on {self.address}: {reply.body}")

    def prepare_for_sleep(self, going: bool) -> None:
        """Send logind's PrepareForSleep(going) to every listener."""
        self._connection.send(new_signal(MANAGER, "PrepareForSleep", "b", (going,)))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._connection.close()
        self._daemon.kill()
        self._daemon.wait(timeout=10)
        self._daemon.stderr.close()

    def _connect(self, socket: Path, timeout: float = 10.0) -> DBusConnection:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return open_dbus_connection(bus=self.address)
            except OSError:
                if self._daemon.poll() is not None or time.monotonic() > deadline:
                    self._daemon.kill()
                    raise RuntimeError(f"dbus-daemon did not listen on {socket}: "
                                       f"{self._daemon.stderr.read().decode(errors='replace')}") from None
                time.sleep(0.05)
