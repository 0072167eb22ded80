"""The relay that starts homegpu's commands on a node without a login each (node_side/scripts/command_relay.py), run
here as a node runs it: `python -c SOURCE`, its socket reached directly (over SSH it is the node's sshd that
connects to it; test_slow_login.py does that on the LAN)."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess
import sys
from typing import Iterator

import pytest
from helpers import wait_for

from homegpu.remote.nodes.relay import RELAY_SOURCE


@pytest.fixture
def relay() -> Iterator[tuple[subprocess.Popen, str]]:
    """A relay running here, and its socket's path."""
    process = subprocess.Popen([sys.executable, "-c", RELAY_SOURCE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    hello = json.loads(process.stdout.readline())
    try:
        yield process, hello["socket"]
    finally:
        process.stdin.close()
        process.wait(timeout=10)
        process.stdout.close()


def command(path: str, argv: list[str], stdin: bytes = b"", half_close: bool = True) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(30)
    conn.connect(path)
    conn.sendall(json.dumps({"argv": argv}).encode() + b"\n" + stdin)
    if half_close:
        conn.shutdown(socket.SHUT_WR)
    return conn


def frame(conn: socket.socket) -> tuple[bytes, bytes]:
    kind, size = struct.unpack(">cI", conn.recv(5, socket.MSG_WAITALL))
    return kind, conn.recv(size, socket.MSG_WAITALL) if size else b""


def frames(conn: socket.socket) -> tuple[bytes, bytes, int | None]:
    """(stdout, stderr, exit status) from a command's frames until the relay closes; `S` first where it started."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.close()
    out, err, status = b"", b"", None
    kinds = []
    while data:
        kind, size = struct.unpack(">cI", data[:5])
        payload, data = data[5:5 + size], data[5 + size:]
        kinds.append(kind)
        if kind == b"S":
            assert kinds == [b"S"] and payload == b""
        elif kind == b"O":
            out += payload
        elif kind == b"E":
            err += payload
        else:
            status = struct.unpack(">i", payload)[0]
    return out, err, status


def test_a_command_gets_its_stdin_and_gives_stdout_stderr_and_status(relay):
    _, path = relay
    script = "import sys; data = sys.stdin.read(); print(len(data)); print('err', file=sys.stderr); sys.exit(3)"
    assert frames(command(path, [sys.executable, "-c", script], b"x" * 300_000)) == (b"300000\n", b"err\n", 3)


def test_argv_is_never_read_by_a_shell(relay):
    _, path = relay
    hostile = "$(touch /tmp/pwned-relay); `id` 'q' \"d\""
    assert frames(command(path, ["printf", "%s", hostile])) == (hostile.encode(), b"", 0)


def test_a_missing_command_and_a_signal_read_as_a_shell_says_them(relay):
    _, path = relay
    assert frames(command(path, ["no-such-command-here"])) == (b"", b"no-such-command-here: command not found\n", 127)
    assert frames(command(path, ["sh", "-c", "kill -9 $$"]))[2] == -9


def test_each_command_is_a_session_of_its_own_in_the_home_folder(relay):
    _, path = relay
    out, _, status = frames(command(path, [sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid()); "
                                           "print(os.getcwd())"]))
    assert status == 0 and out.decode().split() == ["True", os.path.expanduser("~")]


def test_the_half_close_is_the_commands_eof(relay):
    _, path = relay
    conn = command(path, ["cat"], b"kept open", half_close=False)
    assert (frame(conn), frame(conn)) == ((b"S", b""), (b"O", b"kept open"))
    conn.shutdown(socket.SHUT_WR)
    assert frames(conn) == (b"", b"", 0)


def test_a_closed_connection_ends_a_command_that_reads_stdin_as_sshd_does(relay):
    """tied_to_session's watcher reads stdin to its end: the controller gone, it ends, and with it the command."""
    _, path = relay
    conn = command(path, ["sh", "-c", "echo $$; exec cat"], half_close=False)
    assert frame(conn) == (b"S", b"")
    pid = int(frame(conn)[1])
    conn.close()
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10, "cat to end with its connection")


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as status:
            return status.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_socket_is_private_and_goes_with_the_relay(relay):
    process, path = relay
    folder = os.path.dirname(path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    process.stdin.close()  # its SSH channel gone
    assert process.wait(timeout=10) == 0
    assert not os.path.exists(folder)
