"""gRPC's 20 s TCP_USER_TIMEOUT on a TensorFlow server's connections is raised to the peer timeout
(trainer/link_patience.py; tests/test_lan_faults.py cuts a link for 25 s under a real job)."""

from __future__ import annotations

import socket
import subprocess
import sys

from homegpu.trainer.link_patience import TCP_USER_TIMEOUT, raise_user_timeouts


def _user_timeout(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT)


def test_only_timeouts_that_are_set_and_shorter_are_raised():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        longer = socket.create_connection(listener.getsockname())
        with client, accepted, longer:
            accepted.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, 20_000)  # as gRPC's server does
            longer.setsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT, 600_000)
            assert raise_user_timeouts(120_000) >= 1
            assert _user_timeout(accepted) == 120_000
            assert _user_timeout(client) == 0  # the system default (tcp_retries2) stays
            assert _user_timeout(longer) == 600_000
            assert raise_user_timeouts(120_000, fd_dir="/nonexistent") == 0


SERVER_SCRIPT = """
import os, socket, time
import tensorflow as tf
from homegpu.trainer.link_patience import TCP_USER_TIMEOUT, keep_links_through_drops

def open_fds():
    # every descriptor this process holds (TensorFlow opens many: a fixed range could miss ours)
    return sorted(int(fd) for fd in os.listdir("/proc/self/fd") if int(fd) > 2)

def served_side(port):
    # The server's end of our connection: the TCP socket of this process bound to the port.
    for fd in open_fds():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # not open, or not a socket (the duplicate, if any, is left to exit)
            continue
        with sock:
            try:
                if sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port and sock.getpeername():
                    return sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT)
            except OSError:
                continue

def listening_family(port):
    # The family gRPC's listener has (it may listen on IPv6 alone): connecting by the other could reach
    # another program that holds the same port number there.
    for fd in open_fds():
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            try:
                if sock.type == socket.SOCK_STREAM and sock.getsockname()[1] == port:
                    return sock.family
            except (OSError, IndexError):
                continue

server = tf.distribute.Server({"worker": ["localhost:0"]}, job_name="worker", task_index=0)
port = int(server.target.rsplit(":", 1)[1])
loopback = "::1" if listening_family(port) == socket.AF_INET6 else "127.0.0.1"
client = socket.create_connection((loopback, port))
deadline = time.monotonic() + 60
while served_side(port) is None and time.monotonic() < deadline:
    time.sleep(0.1)
print("before", served_side(port))
keep_links_through_drops(90)
while served_side(port) != 90000 and time.monotonic() < deadline:
    time.sleep(0.1)
print("after", served_side(port))
"""


def test_a_tensorflow_servers_connections_get_the_peer_timeout(tensorflow):
    result = subprocess.run([sys.executable, "-c", SERVER_SCRIPT], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["before", "20000", "after", "90000"], result.stdout + result.stderr
