"""A docker-py client for a node's Docker engine, reached through that node's SSH session.

The node's Docker socket is forwarded over the existing SSH connection to a Unix socket in a
private directory here (mode 0700: the forwarded socket itself is created world-accessible, and
whoever can connect to it is root on the node), removed again on exit. Nothing listens on a TCP
port and the engine needs no TLS setup. `host = "local"` nodes use their socket directly.

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

from homegpu.remote.node import NODE_GONE, NodeSession
from homegpu.remote.runtime import RuntimeError_
from homegpu.remote.transport import SshTransport

T = TypeVar("T")

PING_REQUEST = b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n"
PING_TIMEOUT = 10.0
DEFAULT_TIMEOUT = 60.0
# A socket the forward could not reach is diagnosed on the node: OpenSSH only says "open failed".
_DIAGNOSE = """\
import errno, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print({errno.ENOENT: "missing", errno.EACCES: "denied", errno.EPERM: "denied",
           errno.ECONNREFUSED: "refused", errno.ENOTSOCK: "notsocket"}.get(e.errno, "other " + str(e)))
else:
    print("ok")
"""


class DockerUnavailable(RuntimeError_):
    """The node's Docker engine cannot be used; the message names the node and the fix."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        super().__init__(message)


class DockerLink:
    """A connected docker-py client plus the node it talks to (for error messages)."""

    def __init__(self, node: str, client: docker.DockerClient) -> None:
        self.node, self.client = node, client

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
            yield DockerLink(node.name, client)
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
    try:
        try:
            listener = await transport.conn.forward_local_path(local_path, node.spec.docker_socket)
        except (asyncssh.Error, OSError) as exc:
            raise DockerUnavailable(node.name, f"{node.name}: cannot forward the Docker socket over SSH: {exc}; "
                                               "set AllowStreamLocalForwarding yes in the node's sshd_config")
        try:
            yield local_path
        finally:
            listener.close()
            await listener.wait_closed()
    finally:
        shutil.rmtree(private_dir, ignore_errors=True)


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
    except NODE_GONE as exc:
        verdict = f"other {exc}"
    except asyncio.TimeoutError:
        verdict = "other the check timed out"
    return _explain(node, path, verdict)


def _explain(node: NodeSession, path: str, verdict: str) -> str:
    user = node.spec.user or node.cluster.ssh.user or "$USER"
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
    return f"{node.name}: {detail}"

