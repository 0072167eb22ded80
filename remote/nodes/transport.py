"""One node interface, two transports: asyncssh for real nodes, local subprocesses for `local`.

Everything above this module runs commands as argv lists; the SSH transport quotes them with
shlex.join, so no value from cluster.toml is ever interpreted by a remote shell.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import posixpath
import re
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Sequence

import asyncssh
from asyncssh.constants import OPEN_REQUEST_SESSION_FAILED


CHUNK_SIZE = 64 * 1024


# homegpu reads and writes a node's files (work dir, logs, outputs) over SFTP, as scp does by default.
NO_SFTP = ("its SSH server offers no SFTP subsystem, which homegpu needs for files; add "
           "`Subsystem sftp internal-sftp` to /etc/ssh/sshd_config there and restart sshd")


class TransportError(Exception):
    """The connection failed under a command (lost, reset, channel refused)."""


class CommandTimeout(TransportError):
    """A command did not finish within its timeout (killed); the node may only be slow."""


def _no_answer(argv: Sequence[str], timeout: float | None) -> CommandTimeout:
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
        """Terminate and wait (briefly) until it is gone, so no pipe outlives the event loop."""
        self.terminate()
        try:
            await asyncio.wait_for(self.wait(), 5)
        except (asyncio.TimeoutError, TransportError):
            pass


class NodeTransport(abc.ABC):
    """An open connection to one node."""

    peer_address: str | None = None  # the IP address an SSH connection reached (set by connect.py)

    @abc.abstractmethod
    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        """Run argv to completion. Raises CommandTimeout after `timeout` seconds, TransportError when
        the connection fails under it."""

    @abc.abstractmethod
    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        """Start argv with pipes for stdin and stdout."""

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


# -- SSH ----------------------------------------------------------------------------------------


# Runs "$@" but ends it when our stdin closes: a remote process whose SSH channel is gone gets no
# signal and, if it writes nothing (tail -F on a quiet file, an idle iperf3 server), would live on.
# sh gives background jobs /dev/null as stdin, so the watcher gets the real one through fd 3; it
# keeps no stdout open, so our reader still sees EOF as soon as the command ends.
_TIED_SCRIPT = ('exec 3<&0; "$@" </dev/null 3<&- & c=$!; '
                '(cat <&3; kill $c) >/dev/null 2>&1 & exec 3<&-; wait $c')


def tied_to_session(argv: Sequence[str]) -> list[str]:
    """argv wrapped so the command is killed when the session (our end of its stdin) goes away."""
    return ["sh", "-c", _TIED_SCRIPT, "sh", *argv]


class SshProcess(RemoteProcess):
    def __init__(self, process: asyncssh.SSHClientProcess) -> None:
        self._process = process

    def write(self, data: bytes) -> None:
        self._process.stdin.write(data)

    async def drain(self) -> None:
        try:
            await self._process.stdin.drain()
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection lost: {cause(exc)}") from exc

    def close_stdin(self) -> None:
        self._process.stdin.write_eof()

    async def read_chunk(self) -> bytes:
        try:
            return await self._process.stdout.read(CHUNK_SIZE)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection lost: {cause(exc)}") from exc

    async def stderr_text(self) -> str:
        try:
            return (await self._process.stderr.read()).decode("utf-8", "replace")
        except (asyncssh.Error, OSError):
            return ""

    async def wait(self) -> int | None:
        try:
            completed = await self._process.wait(check=False)
        except (asyncssh.Error, OSError):
            return None
        return completed.exit_status if completed.exit_status is not None else None

    def terminate(self) -> None:
        self._process.close()


class SshTransport(NodeTransport):
    def __init__(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn
        self._sftp_client: asyncssh.SFTPClient | None = None
        self._sftp_lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def _sftp(self) -> AsyncIterator[asyncssh.SFTPClient]:
        """The connection's one SFTP session, opened on first use and kept: a new one per call
        costs a channel and a subsystem start on the node. One that fails is dropped, so the next
        call opens a fresh one; asyncssh and OSError errors pass through to the caller."""
        async with self._sftp_lock:
            if self._sftp_client is None:
                self._sftp_client = await self._start_sftp()
            sftp = self._sftp_client
        try:
            yield sftp
        except asyncssh.SFTPError:
            raise  # the node refused this one request (no such file, ...): the session is fine
        except (asyncssh.Error, OSError):
            if self._sftp_client is sftp:
                self._sftp_client = None
                sftp.exit()
            raise

    async def _start_sftp(self) -> asyncssh.SFTPClient:
        try:
            return await self.conn.start_sftp_client()
        except asyncssh.ChannelOpenError as exc:
            if exc.code != OPEN_REQUEST_SESSION_FAILED:
                raise
            raise TransportError(NO_SFTP) from None

    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        try:
            result = await asyncio.wait_for(
                self.conn.run(shlex.join(argv), input=input, encoding=None, check=False), timeout)
        except asyncio.TimeoutError:  # an OSError since Python 3.11: say it, not "connection failed: "
            raise _no_answer(argv, timeout) from None
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection failed during {argv[0]}: {cause(exc)}") from exc
        return CommandResult(
            exit_status=result.exit_status if result.exit_status is not None else -1,
            stdout=_text(result.stdout), stderr=_text(result.stderr),
        )

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        try:
            return SshProcess(await self.conn.create_process(shlex.join(argv), encoding=None))
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot start {argv[0]}: {cause(exc)}") from exc

    async def home_dir(self) -> str:
        try:  # the SFTP subsystem starts no login shell: much cheaper than `echo ~`
            async with self._sftp() as sftp:
                return await sftp.realpath(".")
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot ask for the home directory: {cause(exc)}") from exc

    async def list_tree(self, remote_dir: str, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
        files: dict[str, tuple[int, int]] = {}

        async def walk(sftp: asyncssh.SFTPClient, folder: str, prefix: str) -> None:
            for entry in await sftp.readdir(folder):
                name = entry.filename
                if name in (".", "..") or name in skip:
                    continue
                if entry.attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                    await walk(sftp, posixpath.join(folder, name), prefix + name + "/")
                elif entry.attrs.type == asyncssh.FILEXFER_TYPE_REGULAR:
                    files[prefix + name] = (entry.attrs.size or 0, int(entry.attrs.mtime or 0))

        try:
            async with self._sftp() as sftp:
                if await sftp.isdir(remote_dir):
                    await walk(sftp, remote_dir, "")
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot list {remote_dir}: {cause(exc)}") from exc
        return files

    async def makedirs(self, path: str) -> None:
        try:
            async with self._sftp() as sftp:
                await sftp.makedirs(path, exist_ok=True)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot create {path}: {cause(exc)}") from exc

    async def get_tree(self, remote_dir: str, local_dir: Path) -> None:
        local_dir.parent.mkdir(parents=True, exist_ok=True)
        try:
            async with self._sftp() as sftp:
                await sftp.get(remote_dir, str(local_dir), recurse=True)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"file transfer failed: {cause(exc)}") from exc

    async def wait_closed(self) -> None:
        await self.conn.wait_closed()

    def close(self) -> None:
        if self._sftp_client is not None:
            self._sftp_client.exit()
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

    async def drain(self) -> None:
        try:
            await self._process.stdin.drain()
        except OSError as exc:
            raise TransportError(f"process gone: {cause(exc)}") from exc

    def close_stdin(self) -> None:
        self._process.stdin.close()

    async def read_chunk(self) -> bytes:
        return await self._process.stdout.read(CHUNK_SIZE)

    async def stderr_text(self) -> str:
        return (await self._process.stderr.read()).decode("utf-8", "replace")

    async def wait(self) -> int | None:
        return await self._process.wait()

    def terminate(self) -> None:
        """End the whole process group, as a closed SSH channel ends a remote command's helpers."""
        if self._process.stdin and not self._process.stdin.is_closing():
            self._process.stdin.close()
        try:
            os.killpg(self._process.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass


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
            raise _no_answer(argv, timeout) from None
        return CommandResult(process.returncode or 0, _text(stdout), _text(stderr))

    async def start(self, argv: Sequence[str]) -> RemoteProcess:
        process = LocalProcess(await _spawn(argv))
        self._processes.append(process)
        return process

    async def home_dir(self) -> str:
        return os.path.expanduser("~")

    async def list_tree(self, remote_dir: str, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
        return await asyncio.to_thread(local_tree, Path(remote_dir), skip)

    async def makedirs(self, path: str) -> None:
        await asyncio.to_thread(os.makedirs, path, exist_ok=True)

    async def get_tree(self, remote_dir: str, local_dir: Path) -> None:
        try:
            await asyncio.to_thread(_copy_tree, remote_dir, local_dir)
        except OSError as exc:
            raise TransportError(f"file transfer failed: {cause(exc)}") from exc

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def close(self) -> None:
        for process in self._processes:
            process.terminate()
        self._closed.set()


def local_tree(root: Path, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
    """{relative path: (size, mtime)} of the files under `root`, as list_tree gives for a node."""
    files = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        for name in names:
            path = Path(folder) / name
            stat = path.stat()
            files[path.relative_to(root).as_posix()] = (stat.st_size, int(stat.st_mtime))
    return files


async def _spawn(argv: Sequence[str]) -> asyncio.subprocess.Process:
    pipe = asyncio.subprocess.PIPE
    try:
        return await asyncio.create_subprocess_exec(*argv, stdin=pipe, stdout=pipe, stderr=pipe,
                                                    start_new_session=True)
    except FileNotFoundError:
        # the same answer a shell on a remote node gives, so callers handle one case
        return await asyncio.create_subprocess_exec(
            "sh", "-c", f"echo {shlex.quote(argv[0])}: command not found >&2; exit 127",
            stdin=pipe, stdout=pipe, stderr=pipe)
    except OSError as exc:  # wrapped here, as SshTransport wraps asyncssh's errors: callers catch one type
        raise TransportError(f"cannot start {argv[0]}: {cause(exc)}") from exc


def _copy_tree(source: str, target: Path) -> None:
    """A directory tree, or a single file, copied as SFTP's recursive get does."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if os.path.isdir(source):
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)
