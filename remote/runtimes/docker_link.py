"""A docker-py client for a node's Docker engine, reached through that node's SSH session.

The node's Docker socket is forwarded over the existing SSH connection to a Unix socket in a
private directory here (mode 0700, whatever the socket file's own mode: whoever can connect to it
is root on the node), removed again on exit. Nothing listens on a TCP port and the engine needs no
TLS setup. `host = "local"` nodes use their socket directly. The forwarder is our own (see
SocketForwarder for why not asyncssh's forward_local_path).

Before handing out a client the engine is pinged once through the same path, so every failure
becomes one DockerUnavailable line that names the node and the fix. docker-py blocks, so every call
goes through `DockerLink.call`, which runs it in a thread and translates its errors.

Usage::

    async with docker_client(node) as link:
        containers = await link.call(link.client.containers.list, all=True)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from typing import AsyncIterator, Callable, TypeVar

import asyncssh
import docker
import docker.errors
import requests.exceptions

from homegpu.remote.node_side import script
from homegpu.remote.nodes import NODE_GONE, CommandTimeout, NodeSession, SshTransport
from homegpu.remote.runtimes.errors import RuntimeError_

T = TypeVar("T")

PING_REQUEST = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"
PING_TIMEOUT = 10.0
DEFAULT_TIMEOUT = 60.0
_DIAGNOSE = script("docker_socket")


class DockerUnavailable(RuntimeError_):
    """The node's Docker engine cannot be used; the message names the node and the fix."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(message)


class DockerLink:
    """A connected docker-py client plus the node it talks to (for error messages)."""

    def __init__(self, node: str, client: docker.DockerClient, socket_path: str) -> None:
        self.node, self.client = node, client
        self.socket_path = socket_path  # the local end: the forwarded socket, or the node's own

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    async def call(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """Run a blocking docker-py call in a thread.

        docker.errors.NotFound passes through unchanged (a missing container or image is an answer
        callers act on); every other Docker or connection failure becomes DockerUnavailable.
        """
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except docker.errors.NotFound:
            raise
        except docker.errors.APIError as exc:
            raise DockerUnavailable(self.node, f"{self.node}: Docker refused: {_api_message(exc)}") from exc
        except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
            raise DockerUnavailable(self.node, f"{self.node}: lost the Docker engine: {exc}; "
                                               "check the node with `homegpu doctor`") from exc


def _api_message(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc).strip()


@contextlib.asynccontextmanager
async def docker_client(node: NodeSession, timeout: float | None = DEFAULT_TIMEOUT) -> AsyncIterator[DockerLink]:
    """A DockerLink to `node`'s engine for the duration of the block.

    `timeout` bounds each wait for the engine's answer; None for calls that may stay silent for
    long (loading a multi-gigabyte image answers only once it is all in).

    Raises:
        DockerUnavailable: the node is offline, or its engine cannot be reached (the message says
            why: no Docker installed, engine stopped, no permission, forwarding refused by sshd).
    """
    transport = node.transport
    if transport is None:
        raise DockerUnavailable(node.name, f"{node.name} is {node.state.value}: {node.reason or 'not connected'}")
    async with _socket_for(node, transport) as local_path:
        api_version = await _ping(node, local_path)
        client = await asyncio.to_thread(docker.DockerClient, base_url=f"unix://{local_path}", version=api_version,
                                         timeout=timeout)
        try:
            yield DockerLink(node.name, client, local_path)
        finally:
            await asyncio.to_thread(client.close)


@contextlib.asynccontextmanager
async def _socket_for(node: NodeSession, transport) -> AsyncIterator[str]:
    """The local path of a socket that reaches the node's engine."""
    if not isinstance(transport, SshTransport):
        yield node.spec.docker_socket
        return
    private_dir = tempfile.mkdtemp(prefix="homegpu-docker-")  # mkdtemp: mode 0700, owned by us
    local_path = os.path.join(private_dir, "docker.sock")
    forwarder = SocketForwarder(transport.conn, node.spec.docker_socket)
    try:
        try:
            await forwarder.listen(local_path)
        except OSError as exc:
            raise DockerUnavailable(node.name, f"{node.name}: cannot listen on {local_path}: {exc}") from exc
        yield local_path
    finally:
        await forwarder.close()
        shutil.rmtree(private_dir, ignore_errors=True)


# -- the forwarder ----------------------------------------------------------------------------------
#
# Why not asyncssh's forward_local_path: when the local reader falls behind (a `docker save` read
# only as fast as a slower node's `docker load` takes it), asyncssh pauses the SSH channel, and on
# the first chunk it delivers after a pause it re-opens the whole SSH window although nearly all it
# buffered is still undelivered. Each pause then adds up to a window (2 MiB) to its buffer: copying a
# 2.4 GB image grew this process past 700 MB. Here the channel is paused only when HIGH_WATER bytes
# wait for the local reader and resumed at LOW_WATER; the gap is several windows, so every resume
# drains asyncssh's buffer in one go and memory stays around HIGH_WATER per connection.

HIGH_WATER = 16 << 20
LOW_WATER = 4 << 20


class SocketForwarder:
    """A local Unix socket whose every connection is joined to `remote_path` on the node over SSH."""

    def __init__(self, conn: asyncssh.SSHClientConnection, remote_path: str) -> None:
        self.conn, self.remote_path = conn, remote_path
        self._server: asyncio.AbstractServer | None = None
        self._links: set[_LocalEnd] = set()

    async def listen(self, local_path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _LocalEnd(self), local_path)

    async def close(self) -> None:
        """Stop listening and cut every open connection (both ends)."""
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        if self._server is not None:
            await self._server.wait_closed()


class _LocalEnd(asyncio.Protocol):
    """One accepted local connection and the SSH channel it is joined to."""

    def __init__(self, forwarder: SocketForwarder) -> None:
        self.forwarder = forwarder
        self.transport: asyncio.Transport | None = None
        self.channel: asyncssh.SSHUNIXChannel | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.set_write_buffer_limits(high=HIGH_WATER, low=LOW_WATER)
        self.transport.pause_reading()  # until the channel is open
        self.forwarder._links.add(self)
        self._opening = asyncio.ensure_future(self._open())

    async def _open(self) -> None:
        try:
            self.channel, _ = await self.forwarder.conn.create_unix_connection(
                lambda: _ChannelEnd(self), self.forwarder.remote_path)
        except (asyncssh.Error, OSError):
            self.abort()  # the client reads EOF; docker_client() then diagnoses on the node
            return
        if self.transport.is_closing():  # cut while the channel was opening
            self.channel.close()
        else:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.channel.write(data)

    def eof_received(self) -> bool:
        self.channel.write_eof()
        return True  # half-close: the engine's answer may still come

    def pause_writing(self) -> None:  # HIGH_WATER bytes wait for the local reader
        self.channel.pause_reading()

    def resume_writing(self) -> None:
        self.channel.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.forwarder._links.discard(self)
        if self.channel is not None:
            self.channel.close()

    def abort(self) -> None:
        self.forwarder._links.discard(self)
        if self.channel is not None:
            self.channel.close()
        if self.transport is not None:
            self.transport.close()


class _ChannelEnd(asyncssh.SSHUNIXSession):
    """The SSH side of a _LocalEnd: passes the engine's bytes on, and stops the local reader when
    the channel's send buffer is full (asyncssh does that direction right)."""

    def __init__(self, local: _LocalEnd) -> None:
        self.local = local

    def data_received(self, data: bytes, datatype: object) -> None:
        self.local.transport.write(data)

    def eof_received(self) -> bool:
        if self.local.transport.can_write_eof():
            self.local.transport.write_eof()
        return False

    def pause_writing(self) -> None:
        self.local.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.local.transport.is_closing():
            self.local.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.local.transport.close()


async def _ping(node: NodeSession, local_path: str) -> str:
    """GET /_ping through `local_path`; the engine's API version, or DockerUnavailable saying why not."""
    try:
        reply = await asyncio.wait_for(_ping_once(local_path), PING_TIMEOUT)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        reply = b""
    status_line, _, rest = reply.partition(b"\r\n")
    if status_line.startswith(b"HTTP/1.") and b" 200 " in status_line + b" ":
        return _api_version(rest) or "auto"
    raise DockerUnavailable(node.name, await _diagnose(node, reply))


async def _ping_once(path: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(PING_REQUEST)
        await writer.drain()
        return await reader.read()  # HTTP/1.0: the engine closes after its short answer
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _api_version(headers: bytes) -> str | None:
    for line in headers.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"api-version":
            return value.strip().decode("ascii", "replace")
    return None


async def _diagnose(node: NodeSession, reply: bytes) -> str:
    """One line naming the node, what is wrong with its Docker socket, and the fix."""
    path = node.spec.docker_socket
    if reply:
        status = reply.split(b"\r\n", 1)[0].decode("utf-8", "replace")
        return f"{node.name}: {path} answered {status!r}, not as a Docker engine; check docker_socket in cluster.toml"
    try:
        result = await node.run([node.spec.python, "-c", _DIAGNOSE, path], timeout=30)
        verdict = result.stdout.strip() if result.ok else f"other {result.stderr.strip()}"
    except CommandTimeout:
        verdict = "other the check timed out"
    except NODE_GONE as exc:
        verdict = f"other {exc}"
    return explain(node.name, node.spec.user or node.cluster.ssh.user or "$USER", path, verdict)


def explain(node: str, user: str, path: str, verdict: str) -> str:
    """The message for a diagnosis ("missing", "denied", "refused", "notsocket", "ok", "other …")."""
    messages = {
        "missing": f"no Docker socket at {path}: install Docker Engine "
                   "(https://docs.docker.com/engine/install/), set docker_socket in cluster.toml, "
                   'or use runtime = "process" for this node',
        "denied": f"permission denied on {path}: add the user to the docker group "
                  f"(sudo usermod -aG docker {user}) and reconnect",
        "refused": f"the Docker engine is not running (nothing listens on {path}): "
                   "start it (sudo systemctl enable --now docker)",
        "notsocket": f"{path} is not a socket: set docker_socket in cluster.toml to the engine's socket",
        "ok": f"sshd refused to forward {path}: set AllowStreamLocalForwarding yes in the node's "
              "/etc/ssh/sshd_config and restart sshd",
    }
    detail = messages.get(verdict)
    if detail is None:
        detail = f"cannot reach the Docker engine at {path} ({verdict.removeprefix('other ')}); run `homegpu doctor`"
    return f"{node}: {detail}"

