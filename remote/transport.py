"""One node interface, two transports: asyncssh for real nodes, local subprocesses for `local`.

Everything above this module runs commands as argv lists; the SSH transport quotes them with
shlex.join, so no value from cluster.toml is ever interpreted by a remote shell.
"""

from __future__ import annotations

import abc
import asyncio
import shlex
import signal
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

import asyncssh


@dataclass(frozen=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class RemoteProcess(abc.ABC):
    """A long-running command on a node: write stdin, read stdout lines, stop it."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None: ...

    @abc.abstractmethod
    def close_stdin(self) -> None: ...

    @abc.abstractmethod
    def lines(self) -> AsyncIterator[str]:
        """Stdout, one decoded line at a time (without the newline), until EOF."""

    @abc.abstractmethod
    async def stderr_text(self) -> str:
        """Whatever the process wrote to stderr, once it has ended."""

    @abc.abstractmethod
    async def wait(self) -> int | None:
        """The exit status (None when the node did not report one, e.g. the link died)."""

    @abc.abstractmethod
    def terminate(self) -> None: ...


class NodeTransport(abc.ABC):
    """An open connection to one node."""

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        """Run argv to completion. Raises asyncio.TimeoutError after `timeout` seconds."""

    @abc.abstractmethod
    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        """Start argv with pipes for stdin and stdout."""

    @abc.abstractmethod
    async def wait_closed(self) -> None:
        """Returns when the connection is gone (closed by us, the peer, or keepalive)."""

    @abc.abstractmethod
    def close(self) -> None: ...


# -- SSH ----------------------------------------------------------------------------------------


class SshProcess(RemoteProcess):
    def __init__(self, process: asyncssh.SSHClientProcess) -> None:
        self._process = process

    def write(self, data: bytes) -> None:
        self._process.stdin.write(data)

    def close_stdin(self) -> None:
        self._process.stdin.write_eof()

    async def lines(self) -> AsyncIterator[str]:
        async for raw in self._process.stdout:
            yield raw.decode("utf-8", "replace").rstrip("\r\n")

    async def stderr_text(self) -> str:
        return (await self._process.stderr.read()).decode("utf-8", "replace")

    async def wait(self) -> int | None:
        completed = await self._process.wait(check=False)
        return completed.exit_status if completed.exit_status is not None else None

    def terminate(self) -> None:
        self._process.close()


class SshTransport(NodeTransport):
    def __init__(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn

    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        result = await asyncio.wait_for(
            self.conn.run(shlex.join(argv), input=input, encoding=None, check=False), timeout)
        return CommandResult(
            exit_status=result.exit_status if result.exit_status is not None else -1,
            stdout=_text(result.stdout), stderr=_text(result.stderr),
        )

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        return SshProcess(await self.conn.create_process(shlex.join(argv), encoding=None))

    async def wait_closed(self) -> None:
        await self.conn.wait_closed()

    def close(self) -> None:
        self.conn.close()


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data


# -- local --------------------------------------------------------------------------------------


class LocalProcess(RemoteProcess):
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process

    def write(self, data: bytes) -> None:
        self._process.stdin.write(data)

    def close_stdin(self) -> None:
        self._process.stdin.close()

    async def lines(self) -> AsyncIterator[str]:
        async for raw in self._process.stdout:
            yield raw.decode("utf-8", "replace").rstrip("\r\n")

    async def stderr_text(self) -> str:
        return (await self._process.stderr.read()).decode("utf-8", "replace")

    async def wait(self) -> int | None:
        return await self._process.wait()

    def terminate(self) -> None:
        if self._process.returncode is None:
            self._process.send_signal(signal.SIGTERM)


class LocalTransport(NodeTransport):
    """`host = "local"`: the same operations as subprocesses of this program, no SSH involved."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()
        self._processes: list[LocalProcess] = []

    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        process = await _spawn(argv)
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(input), timeout)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise
        return CommandResult(process.returncode or 0, _text(stdout), _text(stderr))

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        process = LocalProcess(await _spawn(argv))
        self._processes.append(process)
        return process

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self) -> None:
        for process in self._processes:
            process.terminate()
        self._closed.set()


async def _spawn(argv: Sequence[str]) -> asyncio.subprocess.Process:
    pipe = asyncio.subprocess.PIPE
    try:
        return await asyncio.create_subprocess_exec(*argv, stdin=pipe, stdout=pipe, stderr=pipe)
    except FileNotFoundError:
        # the same answer a shell on a remote node gives, so callers handle one case
        return await asyncio.create_subprocess_exec(
            "sh", "-c", f"echo {shlex.quote(argv[0])}: command not found >&2; exit 127",
            stdin=pipe, stdout=pipe, stderr=pipe)
