"""Starts the commands homegpu sends, so that they do not each pay the node's login shell.

sshd hands every command to the user's shell, and bash reads ~/.bashrc for each: pyenv's, conda's or nvm's
init there costs every command its time, a stale lock a minute. This script is started once per SSH
connection, through that login; it listens on a Unix socket in a private folder (mode 0700, so only the
node's user and root reach it) and says where on its stdout, one JSON line: `{"relay": 1, "socket": PATH}`.
The controller reaches the socket by SSH's forwarding to a Unix socket (no shell, no login) once per command.

Each connection to the socket is one command: a JSON line `{"argv": [...]}`, then the command's stdin
(the connection's half-close is its EOF). Back come frames of one byte of kind, four of length and the bytes:
first `S` once the command runs (so a controller that gets none knows it never started), then `O` stdout,
`E` stderr, and last `X` with the exit status (four bytes, signed: -N for a signal). argv is
exec'd, never read by a shell. As under sshd, each command is a session of its own with the login's
environment and the home folder as its working directory, and a connection that closes closes the
command's pipes (it reads EOF, and a write gets SIGPIPE) without killing it.

The relay ends when its stdin does (the SSH channel that started it is gone) and removes its folder; the
commands it started go on, as sshd's would. Standard library only, Python 3.8 or newer.
"""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

CHUNK = 64 * 1024
HEADER_LIMIT = 1 << 20  # argv and its JSON, at most


def send(conn, lock, kind, data):
    """One frame; False once the controller is gone."""
    try:
        with lock:
            conn.sendall(kind + struct.pack(">I", len(data)) + data)
        return True
    except OSError:
        return False


def relay_output(pipe, conn, lock, kind):
    """A pipe of the command to frames until EOF; a controller gone closes the pipe (the command's next write
    gets SIGPIPE, as when sshd's channel closes)."""
    try:
        while True:
            data = os.read(pipe.fileno(), CHUNK)
            if not data or not send(conn, lock, kind, data):
                break
    finally:
        pipe.close()


def relay_input(conn, stdin, data):
    """`data` (what came with the header), then the connection's bytes, to the command's stdin until the
    connection's half-close or close; then its EOF."""
    try:
        while True:
            if data:
                stdin.write(data)
                stdin.flush()
            data = conn.recv(CHUNK)
            if not data:
                break
    except OSError:
        pass
    finally:
        try:
            stdin.close()
        except OSError:
            pass


def read_header(conn):
    """The command's JSON line, and what came after it (the start of its stdin)."""
    data = b""
    while b"\n" not in data:
        chunk = conn.recv(CHUNK)
        if not chunk or len(data) > HEADER_LIMIT:
            return None, b""
        data += chunk
    line, _, rest = data.partition(b"\n")
    return json.loads(line.decode()), rest


def not_started(conn, lock, argv, error):
    """What a shell says of a command it cannot start, and its status (127 not found, 126 not runnable)."""
    missing = isinstance(error, FileNotFoundError)
    said = "command not found" if missing else (error.strerror or str(error))
    send(conn, lock, b"E", ("%s: %s\n" % (argv[0], said)).encode())
    send(conn, lock, b"X", struct.pack(">i", 127 if missing else 126))


def serve_one(conn):
    lock = threading.Lock()
    try:
        header, rest = read_header(conn)
        if not header or not header.get("argv"):
            return
        argv = [str(word) for word in header["argv"]]
        try:
            process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True, cwd=os.path.expanduser("~"))
        except OSError as error:
            not_started(conn, lock, argv, error)
            return
        send(conn, lock, b"S", b"")
        threading.Thread(target=relay_input, args=(conn, process.stdin, rest), daemon=True).start()
        outputs = [threading.Thread(target=relay_output, args=(pipe, conn, lock, kind), daemon=True)
                   for pipe, kind in ((process.stdout, b"O"), (process.stderr, b"E"))]
        for thread in outputs:
            thread.start()
        for thread in outputs:
            thread.join()
        send(conn, lock, b"X", struct.pack(">i", process.wait()))
    except (OSError, ValueError):
        pass
    finally:
        try:
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        conn.close()


def accept_all(server):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        threading.Thread(target=serve_one, args=(conn,), daemon=True).start()


def main():
    folder = tempfile.mkdtemp(prefix="homegpu-relay-")  # 0700: the node's user's alone
    path = os.path.join(folder, "relay.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(path)
        server.listen(64)
        threading.Thread(target=accept_all, args=(server,), daemon=True).start()
        sys.stdout.write(json.dumps({"relay": 1, "socket": path}) + "\n")
        sys.stdout.flush()
        while sys.stdin.buffer.read(CHUNK):  # until the channel that started us is gone
            pass
    finally:
        server.close()
        shutil.rmtree(folder, ignore_errors=True)
    os._exit(0)  # the daemon threads' commands go on; their pipes close with us


if __name__ == "__main__":
    main()
