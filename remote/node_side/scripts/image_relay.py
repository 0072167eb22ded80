"""The node's half of `image copy`: one link of a chain that streams an image from node to node.

The controller runs this file's source on every node of the chain as ``PYTHON -c SOURCE`` (stdlib
only, Python 3.8+, nothing written on the node), its life bounded by ``timeout -s KILL``. It reads
two JSON lines from stdin: its part (role, node names, Docker socket, the secret its upstream must
send) and then where to pass the stream on. The source asks its engine for ``docker save`` at once
and sends it on once it knows where to; every target loads what it receives into its own engine
while passing it to the next node, so the image crosses every link once. It reports JSON lines on
stdout (listening, progress, received, loaded, next_failed, error) and stops at once when its stdin
closes: the controller gave up.

Between nodes the stream is plain TCP: the connection opens with a one-time secret that only the
controller (over SSH) handed to both ends; a connection without it is closed unread. Frames are a
4-byte length and that many bytes; a zero length and the 8-byte total end the stream, so a link
that drops mid-way is never taken for the end of the image. Every wait is bounded: a silent
upstream or a stuck downstream for `idle` seconds fails that hop. A downstream that fails does not
stop this node: it goes on receiving and loading, and only the nodes after it miss the image.
"""

import hmac
import http.client
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from urllib.parse import quote

CHUNK = 1 << 20
HEADER = struct.Struct("!I")
TOTAL = struct.Struct("!Q")
SECRET_BYTES = 32
AUTH_WAIT = 10.0  # seconds a connection may take to send its secret
QUEUE_CHUNKS = 16  # chunks waiting for the local load, at most

_out = threading.Lock()


def emit(event, **fields):
    fields["event"] = event
    with _out:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to the Docker engine's Unix socket."""

    def __init__(self, path, timeout):
        http.client.HTTPConnection.__init__(self, "docker", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Progress:
    """Reports bytes every `seconds` or `step` bytes, whichever comes first."""

    def __init__(self, seconds, step):
        self.seconds, self.step = seconds, step
        self.total = self.last_total = 0
        self.last_time = time.monotonic()

    def add(self, count):
        self.total += count
        now = time.monotonic()
        if self.total - self.last_total >= self.step or now - self.last_time >= self.seconds:
            emit("progress", bytes=self.total)
            self.last_total, self.last_time = self.total, now


def recv_exact(sock, size, what):
    parts, left = [], size
    while left:
        part = sock.recv(min(left, CHUNK))
        if not part:
            raise ConnectionError("%s closed the connection mid-way" % what)
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def listen(address, port):
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(4)
    return listener


def accept(listener, secret, wait, idle, upstream):
    """The first connection that sends `secret`; others are closed unread and reported."""
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("%s never connected (waited %.0f s)" % (upstream, wait))
        listener.settimeout(left)
        try:
            conn, peer = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(AUTH_WAIT)
        try:
            got = recv_exact(conn, SECRET_BYTES, "a peer")
        except OSError:
            got = b""
        if hmac.compare_digest(got, secret):
            conn.settimeout(idle)
            return conn
        emit("rejected", peer=peer[0])
        conn.close()


def connect(hop, idle):
    """A connection to the next node that has sent that node's secret. Raises OSError saying where."""
    where = "%s at %s:%d" % (hop["name"], hop["host"], hop["port"])
    try:
        sock = socket.create_connection((hop["host"], hop["port"]), timeout=idle)
        sock.sendall(bytes.fromhex(hop["secret"]))
    except OSError as exc:
        raise OSError("cannot reach %s: %s" % (where, exc.strerror or exc)) from None
    return sock


class Loader(threading.Thread):
    """`docker load` through the engine's API, fed chunk by chunk from a bounded queue."""

    def __init__(self, socket_path):
        threading.Thread.__init__(self, daemon=True)
        self.socket_path = socket_path
        self.chunks = queue.Queue(QUEUE_CHUNKS)
        self.result = None
        self.error = None

    def feed(self, chunk):
        """Queue a chunk (or None: the end); False once the load has failed (chunks then go nowhere)."""
        while self.error is None:
            try:
                self.chunks.put(chunk, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    def abort(self):
        self.feed(ConnectionAbortedError("the stream broke"))

    def _body(self):
        while True:
            chunk = self.chunks.get()
            if chunk is None:
                return
            if isinstance(chunk, BaseException):
                raise chunk  # the engine sees a cut request and discards what it got
            yield chunk

    def run(self):
        conn = UnixHTTPConnection(self.socket_path, None)
        try:
            conn.request("POST", "/images/load?quiet=1", body=self._body(),
                         headers={"Content-Type": "application/x-tar"}, encode_chunked=True)
            reply = conn.getresponse()
            text = reply.read().decode("utf-8", "replace")
            self.result = self._loaded(reply.status, text)
        except Exception as exc:  # noqa: BLE001 (reported as this node's error)
            self.error = "the Docker engine's load failed: %s" % (exc,)
        finally:
            conn.close()

    def _loaded(self, status, text):
        loaded = ""
        for line in text.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "error" in message:
                raise RuntimeError((message.get("errorDetail") or {}).get("message") or message["error"])
            loaded = (message.get("stream") or "").strip() or loaded
        if status != 200:
            raise RuntimeError("HTTP %d: %s" % (status, text.strip()[:200]))
        return loaded or "loaded"


class Export:
    """`docker save` through the engine's API, asked for as soon as the relay has its part: the
    engine works a while before its first byte (0.9 s for 300 MB on the test VM), which then overlaps
    the targets' starts. A failure is said once the hop is known, when the controller is listening."""

    def __init__(self, part):
        self.image = part["image"]
        self.idle, self.wait = part["idle"], part.get("export_wait", part["idle"])
        self.conn = UnixHTTPConnection(part["socket"], part["idle"])
        self.failed = None
        try:
            self.conn.request("GET", "/images/%s/get" % quote(self.image, safe=""))
        except OSError as exc:
            self.failed = exc

    def response(self):
        """The engine's reply and its first chunk, both waited for up to `export_wait`: a big image takes the engine a
        while before its first byte (its headers may come first), more on a busy machine."""
        if self.failed is not None:
            raise self.failed
        self.conn.sock.settimeout(self.wait)
        try:
            reply = self.conn.getresponse()
            if reply.status != 200:
                raise RuntimeError("the Docker engine would not export %s: HTTP %d %s" % (
                    self.image, reply.status, reply.read(300).decode("utf-8", "replace").strip()))
            first = reply.read(CHUNK)
        except socket.timeout:
            raise TimeoutError("the Docker engine had not begun to export %s after %.0f s" % (
                self.image, self.wait)) from None
        self.conn.sock.settimeout(self.idle)
        return reply, first


def run_source(part, export, hop):
    """Stream the engine's export of the image to the first target, once it has begun (the target waits for that
    in accept())."""
    reply, chunk = export.response()
    down = connect(hop, part["idle"])
    progress = Progress(part["progress_seconds"], part["progress_bytes"])
    try:
        while chunk:
            down.sendall(HEADER.pack(len(chunk)) + chunk)
            progress.add(len(chunk))
            chunk = reply.read(CHUNK)
        down.sendall(HEADER.pack(0) + TOTAL.pack(progress.total))
    except OSError as exc:
        raise OSError("sending to %s failed after %d bytes: %s" % (hop["name"], progress.total,
                                                                  exc.strerror or exc)) from None
    emit("sent", bytes=progress.total)


def run_target(part, listener, hop):
    """Receive the stream, load it here and pass it on to `hop` (None: the chain ends here)."""
    down = None
    if hop is not None:
        try:
            down = connect(hop, part["idle"])
        except OSError as exc:
            emit("next_failed", error=str(exc))
    up = accept(listener, bytes.fromhex(part["secret"]), part["accept_wait"], part["idle"], part["upstream"])
    listener.close()
    loader = Loader(part["socket"])
    loader.start()
    progress = Progress(part["progress_seconds"], part["progress_bytes"])
    try:
        total = relay(up, down, loader, progress, part["upstream"], hop)
    except BaseException:
        loader.abort()
        raise
    emit("received", bytes=total)
    loader.feed(None)
    loader.join()
    if loader.error is not None:
        raise RuntimeError(loader.error)
    emit("loaded", detail=loader.result)


def relay(up, down, loader, progress, upstream, hop):
    """Frames from `up` to `down` and the local load until the end frame; the bytes received."""
    while True:
        try:
            header = recv_exact(up, HEADER.size, upstream)
            size = HEADER.unpack(header)[0]
            data = recv_exact(up, size, upstream) if size else recv_exact(up, TOTAL.size, upstream)
        except socket.timeout:
            raise TimeoutError("%s sent nothing for %.0f s (after %d bytes)" % (
                upstream, up.gettimeout(), progress.total)) from None
        except OSError as exc:
            raise ConnectionError("the stream from %s broke after %d bytes: %s" % (
                upstream, progress.total, exc)) from None
        if down is not None:
            try:
                down.sendall(header + data)
            except OSError as exc:
                emit("next_failed", error="sending to %s failed after %d bytes: %s" % (
                    hop["name"], progress.total, exc.strerror or exc))
                down.close()
                down = None
        if not size:
            if TOTAL.unpack(data)[0] != progress.total:
                raise ConnectionError("%s ended the stream after %d bytes, announcing %d" % (
                    upstream, progress.total, TOTAL.unpack(data)[0]))
            break
        loader.feed(data)
        progress.add(size)
    if down is not None:
        down.close()
    return progress.total


def _stop_when_stdin_closes():
    sys.stdin.buffer.read()
    os._exit(3)


def main():
    part = json.loads(sys.stdin.buffer.readline())
    listener = export = None
    if part["role"] == "source":
        export = Export(part)
    else:
        try:
            listener = listen(part["listen"], part["port"])
        except OSError as exc:
            emit("error", error="cannot listen on %s:%d: %s" % (part["listen"], part["port"], exc.strerror or exc))
            return 1
        emit("listening", port=listener.getsockname()[1])
    line = sys.stdin.buffer.readline()
    if not line:
        return 3  # the controller gave up before the chain was complete
    hop = json.loads(line)["next"]
    threading.Thread(target=_stop_when_stdin_closes, daemon=True).start()
    try:
        if part["role"] == "source":
            run_source(part, export, hop)
        else:
            run_target(part, listener, hop)
    except Exception as exc:  # noqa: BLE001 (one line for the controller, no traceback)
        emit("error", error=str(exc) or type(exc).__name__)
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    # Not sys.exit(): the stdin watcher blocks in a read holding stdin's lock, and the interpreter's
    # shutdown waits 1 s for that lock, then aborts (SIGABRT): a second lost on every relay.
    os._exit(status)
