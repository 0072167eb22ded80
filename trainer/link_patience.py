"""Keep TensorFlow's gRPC connections open through a Wi-Fi drop of up to the peer timeout.

gRPC gives every connection its server accepts a TCP_USER_TIMEOUT of 20 s (its server keepalive
default): once data sent on it stays unacknowledged for 20 s, the kernel closes it. A worker's
peers call its server, so a 25 s drop closes them, and when the link is back the first RPC on
each meets "Connection reset by peer" and the collective in flight fails (worker RPCs are not
retried). TensorFlow passes no channel arguments to its server (TF_GRPC_DEFAULT_OPTIONS reaches
only the client channels, which set no TCP_USER_TIMEOUT unless keepalive is on), so nothing in its
configuration changes that 20 s.

So a thread raises it on this process's sockets: every second it finds TCP sockets whose
TCP_USER_TIMEOUT is set but shorter than the peer timeout (gRPC's, never the system default 0)
and sets the peer timeout. A dead peer is still noticed: its connection closes once data has gone
unacknowledged for that long, the bound the coordination service's heartbeat has
(coordination.py), and homegpu sees a worker that exited at once.
"""

from __future__ import annotations

import os
import socket
import threading

TCP_USER_TIMEOUT = getattr(socket, "TCP_USER_TIMEOUT", 18)  # 18 is its number on Linux
SCAN_SECONDS = 1.0  # far below gRPC's 20 s: a new connection is covered long before it matters


def raise_user_timeouts(milliseconds: int, fd_dir: str = "/proc/self/fd") -> int:
    """One pass: give every TCP socket of this process with a TCP_USER_TIMEOUT in (0, milliseconds)
    that timeout instead. Returns how many were raised. Sockets that vanish meanwhile are skipped."""
    raised = 0
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return 0
    for name in fds:
        try:
            if os.readlink(os.path.join(fd_dir, name)).startswith("socket:") and _raise_one(int(name), milliseconds):
                raised += 1
        except (OSError, ValueError):
            continue  # closed meanwhile, or not a descriptor
    return raised


def _raise_one(fd: int, milliseconds: int) -> bool:
    """Raise one socket's TCP_USER_TIMEOUT when it is set and shorter; True when it was raised."""
    # A duplicate descriptor reaches the same socket and leaves gRPC's own descriptor untouched.
    duplicate = os.dup(fd)
    try:
        sock = socket.socket(fileno=duplicate)
    except OSError:  # the number was reused for something that is not a socket
        os.close(duplicate)
        return False
    with sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
            return False
        current = sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT)
        if not 0 < current < milliseconds:
            return False
        sock.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, milliseconds)
        return True


def keep_links_through_drops(seconds: float, stop: threading.Event | None = None) -> threading.Thread | None:
    """Start the daemon thread that keeps raising gRPC's TCP_USER_TIMEOUT to `seconds`, until `stop`
    is set (never, by default). Returns it, or None without /proc/self/fd (not Linux: gRPC sets no
    TCP_USER_TIMEOUT there)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    milliseconds, stop = int(seconds * 1000), stop or threading.Event()

    def scan() -> None:
        while not stop.wait(SCAN_SECONDS):
            raise_user_timeouts(milliseconds)

    thread = threading.Thread(target=scan, name="homegpu-link-patience", daemon=True)
    thread.start()
    return thread
