"""What every transport offers (NodeTransport, RemoteProcess), what a command returns, and the errors
a connection raises under a command: the interface above the SSH and local transports."""

from __future__ import annotations

import abc
import asyncio
import contextlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Sequence

from homegpu.remote.nodes.login_time import LoginTiming


CHUNK_SIZE = 64 * 1024


class TransportError(Exception):
    """The connection failed under a command (lost, reset, channel refused)."""


class CommandTimeout(TransportError):
    """A command did not finish within its timeout (killed); the node may only be slow."""


def no_answer(argv: Sequence[str], timeout: float | None) -> CommandTimeout:
    return CommandTimeout(f"{argv[0]} did not answer within {timeout:g} s (is the node overloaded, or its "
                          "connection dead?)")


def cause(exc: BaseException) -> str:
    """What went wrong, for a person: the exception's message, else its type in words ("connection
    lost" for an asyncssh.ConnectionLost without a reason), never an empty string."""
    return str(exc).strip() or re.sub(r"(?<=[a-z])(?=[A-Z])", " ", type(exc).__name__).lower()


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    @property
    def telling_line(self) -> str:
        """The most telling line of what it said: stderr's last, else stdout's, else its exit status."""
        lines = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return lines[-1] if lines else f"exit status {self.exit_status}"


class RemoteProcess(abc.ABC):
    """A long-running command on a node: write stdin, read stdout lines, stop it."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until what write() buffered has gone out, so a long stream stays bounded in memory.
        Raises TransportError when the other end is gone."""

    @abc.abstractmethod
    def close_stdin(self) -> None: ...

    @abc.abstractmethod
    async def read_chunk(self) -> bytes:
        """The next bytes of stdout, b"" at EOF."""

    async def raw_lines(self) -> AsyncIterator[bytes]:
        """Stdout, one line at a time as sent (newline included; the last may lack it), until EOF.

        Lines are cut here rather than by the stream's readline(), which may hand back pieces of
        a line at chunk boundaries, or fail on lines longer than its buffer.
        """
        pending = b""
        while chunk := await self.read_chunk():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line + b"\n"
        if pending:
            yield pending

    async def lines(self) -> AsyncIterator[str]:
        """Stdout, one decoded line at a time (without the newline), until EOF."""
        async for raw in self.raw_lines():
            yield raw.decode("utf-8", "replace").rstrip("\r\n")

    @abc.abstractmethod
    async def stderr_text(self) -> str:
        """Whatever the process wrote to stderr, once it has ended."""

    @abc.abstractmethod
    async def wait(self) -> int | None:
        """The exit status (None when the node did not report one, e.g. the link died)."""

    @abc.abstractmethod
    def terminate(self) -> None: ...

    async def close(self) -> None:
        """Terminate and wait (briefly) until it is gone, so no pipe outlives the event loop. asyncio.timeout, not
        wait_for: Python 3.11's wait_for loses a cancel that comes as wait() ends in the same pass (nodes/waiting.py),
        and a relay's command (nodes/relay.py) ends at once when its connection is gone."""
        self.terminate()
        with contextlib.suppress(TimeoutError, TransportError):
            async with asyncio.timeout(5):
                await self.wait()


class NodeTransport(abc.ABC):
    """An open connection to one node."""

    peer_address: str | None = None  # the IP address an SSH connection reached (set by connect.py)
    shell_banner: str = ""  # what the node's login shell printed before a command (see OUTPUT_MARK)
    sftp_trouble: str = ""  # why SFTP cannot work on the node, once found out: files go by commands

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        """Run argv to completion. Raises CommandTimeout after `timeout` seconds, TransportError when
        the connection fails under it."""

    @abc.abstractmethod
    async def start(self, argv: Sequence[str], *, by_login: bool = False) -> RemoteProcess:
        """Start argv with pipes for stdin and stdout. `by_login`: through a login of its own even where commands
        have a faster way (a process that lives as long as the connection pays one login either way)."""

    async def time_login(self, timeout: float) -> LoginTiming | None:
        """One login of the node's shell, timed (nodes/login_time.py); None where commands start without one."""
        return None

    @abc.abstractmethod
    async def home_dir(self) -> str:
        """The node user's home directory (to expand ~ without starting a shell)."""

    @abc.abstractmethod
    async def list_tree(self, remote_dir: str, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
        """{relative path: (size, mtime)} of the files under a directory ({} when it is missing),
        leaving out directories named in `skip`."""

    @abc.abstractmethod
    async def makedirs(self, path: str) -> None:
        """Create a directory (absolute path) and its parents on the node, as the node's user."""

    @abc.abstractmethod
    async def get_tree(self, remote_dir: str, local_dir: Path) -> None:
        """Copy a directory tree from the node (absolute path) to this machine."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Returns when the connection is gone (closed by us, the peer, or keepalive)."""

    @abc.abstractmethod
    def close(self) -> None: ...
