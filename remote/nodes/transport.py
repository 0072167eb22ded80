"""One node interface, two transports: asyncssh for real nodes, local subprocesses for `local`.

Everything above this module runs commands as argv lists; the SSH transport quotes them with
shlex.join, so no value from cluster.toml is ever interpreted by a remote shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Sequence

import asyncssh
from asyncssh.constants import OPEN_REQUEST_SESSION_FAILED

from homegpu.remote.nodes import exec_files
from homegpu.remote.nodes.login_probe import time_login
from homegpu.remote.nodes.login_time import LoginTiming, without_rehash
from homegpu.remote.nodes.relay import Relay, RelayRefused, open_command, run_command
from homegpu.remote.nodes.transport_base import (
    CHUNK_SIZE, CommandResult, CommandTimeout, NodeTransport, RemoteProcess, TransportError, cause, no_answer,
)

__all__ = [
    "CHUNK_SIZE", "CommandResult", "CommandTimeout", "LocalTransport", "NodeTransport", "RemoteProcess",
    "SshTransport", "TransportError", "cause", "framed", "local_tree", "split_banner", "tied_to_session",
]


# homegpu reads a node's files (work dir, outputs) over SFTP, as scp does by default, and over
# commands (exec_files) where the node has none.
NO_SFTP = "its SSH server offers no SFTP subsystem"


# -- SSH ----------------------------------------------------------------------------------------


# Runs "$@" but ends it when our stdin closes: a remote process whose SSH channel is gone gets no
# signal and, if it writes nothing (tail -F on a quiet file, an idle iperf3 server), would live on.
# sh gives background jobs /dev/null as stdin, so the watcher gets the real one through fd 3; it
# keeps no stdout open, so our reader still sees EOF as soon as the command ends.
_TIED_SCRIPT = ('exec 3<&0; "$@" </dev/null 3<&- & c=$!; '
                '(cat <&3; kill $c) >/dev/null 2>&1 & exec 3<&-; wait $c')


# A login shell may print before it runs the command sshd hands it (an `echo` in ~/.bashrc above
# its interactive guard, a conda or fortune line: bash reads .bashrc for every SSH command). So each
# command first writes a marker line to stdout and to stderr, then execs argv: what precedes the
# marker is the shell's (kept as the transport's `shell_banner`, for doctor), never the answer.
OUTPUT_MARK = "--homegpu-output--"
_MARK_LINE = (OUTPUT_MARK + "\n").encode()


def framed(argv: Sequence[str]) -> str:
    """The remote command line for argv: the marker on stdout and stderr, then argv exec'd (so its
    exit status and signals are the command's own). Values are quoted: no shell reads them."""
    mark = shlex.quote(OUTPUT_MARK)
    return f"printf '%s\\n' {mark}; printf '%s\\n' {mark} >&2; exec {shlex.join(argv)}"


def split_banner(data: bytes) -> tuple[bytes, bytes]:
    """(what the login shell printed before the marker, the command's own output). Without a marker
    (the shell never got to the command) everything is the command's."""
    head, mark, rest = data.partition(_MARK_LINE)
    return (head, rest) if mark else (b"", data)


def tied_to_session(argv: Sequence[str]) -> list[str]:
    """argv wrapped so the command is killed when the session (our end of its stdin) goes away."""
    return ["sh", "-c", _TIED_SCRIPT, "sh", *argv]


class SshProcess(RemoteProcess):
    def __init__(self, process: asyncssh.SSHClientProcess, on_banner=None) -> None:
        self._process = process
        self._before_mark: bytes | None = b""  # None once the marker has passed
        self._on_banner = on_banner or (lambda banner: None)

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
        while self._before_mark is not None:  # the login shell's output, up to the marker
            chunk = await self._read()
            head, mark, rest = (self._before_mark + chunk).partition(_MARK_LINE)
            if not mark and chunk:
                self._before_mark = head
                continue
            self._before_mark = None
            self._on_banner(head if mark else b"")
            if not mark:  # EOF before any marker: the shell never ran the command; all of it is output
                return head
            if rest:
                return rest
        return await self._read()

    async def _read(self) -> bytes:
        try:
            return await self._process.stdout.read(CHUNK_SIZE)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection lost: {cause(exc)}") from exc

    async def stderr_text(self) -> str:
        try:
            return split_banner(await self._process.stderr.read())[1].decode("utf-8", "replace")
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


# OpenSSH's default MaxSessions: the session channels (commands, SFTP) one connection may hold.
# Port forwards do not count. A node set lower refuses the channel past its limit; we learn it then.
SESSIONS_PER_CONNECTION = 10


@dataclass
class _Link:
    """One SSH connection to the node and how many of its session channels are open."""

    conn: asyncssh.SSHClientConnection
    limit: int = SESSIONS_PER_CONNECTION
    open: int = 0


class SshTransport(NodeTransport):
    """A node over SSH: the first connection (stats, SFTP, forwards, keepalive), and more opened by
    `open_more` when its session channels run out, so twelve workers never meet MaxSessions."""

    def __init__(self, conn: asyncssh.SSHClientConnection, open_more=None, python: str | None = None) -> None:
        self.conn = conn
        # commands through one relay (nodes/relay.py) rather than a login each, where the node's python can run it
        self._relay = Relay(conn, python, framed, _MARK_LINE, self._heard_banner) if python else None
        self._links = [_Link(conn)]
        self._open_more = open_more
        self._link_lock = asyncio.Lock()
        self._releases: set[asyncio.Task] = set()
        self._sftp_client: asyncssh.SFTPClient | None = None
        self._sftp_lock = asyncio.Lock()
        self.sftp_trouble = ""  # why SFTP cannot work on this node, once found out: files go by commands

    async def _with_session(self, opener):
        """(link, opener(conn)) on a connection with a session channel to spare, its slot taken.
        A channel refused by a link that already holds some (OpenSSH's "open failed": MaxSessions
        below its default) lowers that link's limit and goes to another connection."""
        while True:
            link = await self._link_with_room()
            link.open += 1
            try:
                return link, await opener(link.conn)
            except asyncssh.ChannelOpenError as exc:
                link.open -= 1
                if exc.code == OPEN_REQUEST_SESSION_FAILED or link.open == 0 or self._open_more is None:
                    raise  # the command's request failed, or a fresh connection refuses: not a limit
                link.limit = link.open
            except BaseException:
                link.open -= 1
                raise

    async def _link_with_room(self) -> _Link:
        async with self._link_lock:
            # an extra connection that died (its own keepalive) is dropped; the first one is the node's
            self._links[1:] = [link for link in self._links[1:] if not link.conn.is_closed()]
            for link in self._links:
                if link.open < link.limit:
                    return link
            if self._open_more is None:
                return self._links[0]
            try:
                link = _Link(await self._open_more())
            except Exception as exc:  # NodeError and the like: the caller handles TransportError
                raise TransportError(f"cannot open another SSH connection (the first holds {self._links[0].open} "
                                     f"sessions): {cause(exc)}") from exc
            self._links.append(link)
            return link

    def _release_when_closed(self, link: _Link, process: asyncssh.SSHClientProcess) -> None:
        async def release() -> None:
            with contextlib.suppress(Exception):
                await process.wait_closed()
            link.open -= 1
        task = asyncio.create_task(release())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    def _heard_banner(self, banner: bytes) -> None:
        text = without_rehash(_text(banner)).strip()
        if text:
            self.shell_banner = text

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
                self._drop_sftp()
            raise

    async def _start_sftp(self) -> asyncssh.SFTPClient:
        link = self._links[0]
        link.open += 1  # the SFTP session is a channel of the first connection while it lives
        try:
            return await self.conn.start_sftp_client()
        except BaseException as exc:
            link.open -= 1
            if isinstance(exc, asyncssh.ChannelOpenError) and exc.code == OPEN_REQUEST_SESSION_FAILED:
                raise TransportError(NO_SFTP) from None
            raise

    def _drop_sftp(self) -> None:
        if self._sftp_client is not None:
            self._sftp_client.exit()
            self._sftp_client = None
            self._links[0].open -= 1

    @property
    def relay_trouble(self) -> str:
        """Why commands go through the login shell on this connection ("" while the relay takes them)."""
        return self._relay.trouble if self._relay else "no relay asked for"

    @property
    def relay_socket(self) -> str:
        """Where the node's relay listens ("" while none is up)."""
        return self._relay.socket_path if self._relay else ""

    @property
    def last_login(self) -> LoginTiming | None:
        """The login the relay's start paid, timed (None before it, or without a relay)."""
        return self._relay.login if self._relay else None

    @property
    def login_waiting(self) -> float | None:
        """Seconds the relay's login has been waited for so far; None when none is waited for."""
        return self._relay.login_waiting if self._relay else None

    async def _relay_socket(self) -> str | None:
        return await self._relay.socket() if self._relay else None

    async def run(self, argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> CommandResult:
        try:  # asyncio.timeout: wait_for would lose a cancel that comes as a relayed command ends (waiting.py)
            async with asyncio.timeout(timeout):
                return await self._run(argv, input)
        except TimeoutError:  # an OSError since Python 3.11: say it, not "connection failed: "
            raise no_answer(argv, timeout) from None

    async def _run(self, argv: Sequence[str], input: bytes | None) -> CommandResult:
        """Through the relay where it is up, else through a login as before."""
        socket = await self._relay_socket()
        if socket:
            try:
                return await run_command(self.conn, socket, argv, input)
            except RelayRefused as exc:
                await self._relay.refused(str(exc))
            except (asyncssh.Error, OSError) as exc:
                raise TransportError(f"connection failed during {argv[0]}: {cause(exc)}") from exc
        return await self._run_by_login(argv, input)

    async def _run_by_login(self, argv: Sequence[str], input: bytes | None) -> CommandResult:
        async def command(conn: asyncssh.SSHClientConnection):
            return await conn.run(framed(argv), input=input, encoding=None, check=False)

        link = None
        try:
            link, result = await self._with_session(command)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection failed during {argv[0]}: {_refusal(exc)}") from exc
        finally:
            if link is not None:
                link.open -= 1
        banner, stdout = split_banner(result.stdout or b"")
        banner_err, stderr = split_banner(result.stderr or b"")
        self._heard_banner(banner + banner_err)
        return CommandResult(
            exit_status=result.exit_status if result.exit_status is not None else -1,
            stdout=_text(stdout), stderr=_text(stderr),
        )

    async def start(self, argv: Sequence[str], *, by_login: bool = False) -> RemoteProcess:
        socket = None if by_login else await self._relay_socket()
        if socket:
            try:
                return await open_command(self.conn, socket, argv)
            except RelayRefused as exc:
                await self._relay.refused(str(exc))
            except (asyncssh.Error, OSError) as exc:
                raise TransportError(f"cannot start {argv[0]}: {cause(exc)}") from exc

        async def process(conn: asyncssh.SSHClientConnection):
            return await conn.create_process(framed(argv), encoding=None)

        try:
            link, started = await self._with_session(process)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot start {argv[0]}: {_refusal(exc)}") from exc
        self._release_when_closed(link, started)
        return SshProcess(started, self._heard_banner)

    async def time_login(self, timeout: float) -> LoginTiming:
        """`true` through the login shell, its login timed: at most `timeout` seconds, however stuck."""
        async def process(conn: asyncssh.SSHClientConnection):
            return await conn.create_process(framed(["true"]), encoding=None)

        try:
            async with asyncio.timeout(timeout):
                link, started = await self._with_session(process)
        except TimeoutError:
            return LoginTiming(None, "", timeout)
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"cannot start a login: {_refusal(exc)}") from exc
        self._release_when_closed(link, started)
        return await time_login(started, _MARK_LINE, timeout)

    # -- files: over SFTP where it works, else over commands (exec_files) ---------------------

    async def _by_sftp(self, what: str, operation, fallback):
        """operation(sftp), or fallback() once SFTP has shown it cannot work on this node (no
        subsystem, or a login shell printing into sftp-server's stream); `sftp_trouble` says why.
        A request the node refuses (no such file, permission) is a TransportError naming `what`."""
        if not self.sftp_trouble:
            try:
                async with self._sftp() as sftp:
                    return await operation(sftp)
            except (asyncssh.SFTPBadMessage, asyncssh.SFTPConnectionLost) as exc:
                self._give_up_sftp(cause(exc))
            except asyncssh.SFTPError as exc:
                raise TransportError(f"{what}: {cause(exc)}") from exc
            except TransportError as exc:  # no SFTP subsystem (NO_SFTP)
                self._give_up_sftp(str(exc))
            except (asyncssh.Error, OSError) as exc:
                raise TransportError(f"{what}: {cause(exc)}") from exc
        return await fallback()

    def _give_up_sftp(self, why: str) -> None:
        self.sftp_trouble = why
        self._drop_sftp()

    async def home_dir(self) -> str:
        # the SFTP subsystem starts no login shell: much cheaper than `cd && pwd`
        return await self._by_sftp("cannot ask for the home directory", lambda sftp: sftp.realpath("."),
                                   lambda: exec_files.home_dir(self))

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

        async def by_sftp(sftp: asyncssh.SFTPClient) -> dict[str, tuple[int, int]]:
            files.clear()
            if await sftp.isdir(remote_dir):
                await walk(sftp, remote_dir, "")
            return files

        return await self._by_sftp(f"cannot list {remote_dir}", by_sftp,
                                   lambda: exec_files.list_tree(self, remote_dir, skip))

    async def makedirs(self, path: str) -> None:
        await self._by_sftp(f"cannot create {path}", lambda sftp: sftp.makedirs(path, exist_ok=True),
                            lambda: exec_files.makedirs(self, path))

    async def get_tree(self, remote_dir: str, local_dir: Path) -> None:
        async def by_sftp(sftp: asyncssh.SFTPClient) -> None:
            local_dir.parent.mkdir(parents=True, exist_ok=True)
            await sftp.get(remote_dir, str(local_dir), recurse=True)

        await self._by_sftp("file transfer failed", by_sftp, lambda: exec_files.get_tree(self, remote_dir, local_dir))

    async def wait_closed(self) -> None:
        await self.conn.wait_closed()

    def close(self) -> None:
        if self._relay:
            self._relay.close()
        self._drop_sftp()
        for link in self._links:
            link.conn.close()


def _refusal(exc: BaseException) -> str:
    """cause(exc), naming the node's sshd setting when it refused a session channel outright."""
    if isinstance(exc, asyncssh.ChannelOpenError) and exc.code != OPEN_REQUEST_SESSION_FAILED:
        return (f"the node's sshd refused a session channel ({cause(exc)}): check MaxSessions in its "
                "/etc/ssh/sshd_config (OpenSSH's default is 10; 0 allows no commands)")
    return cause(exc)


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
            raise no_answer(argv, timeout) from None
        return CommandResult(process.returncode or 0, _text(stdout), _text(stderr))

    async def start(self, argv: Sequence[str], *, by_login: bool = False) -> RemoteProcess:
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
