"""Commands on a node without a login each: node_side/scripts/command_relay.py, started once per connection.

sshd hands every command to the user's shell, and bash reads ~/.bashrc for each (pyenv's init: 0.1 s a
command; a stale rehash lock: 60 s). The relay is started through one login, and every later command reaches
it through SSH's forwarding to its Unix socket, which starts no shell: a channel, the command's JSON line,
its stdin, and back its output and exit status in frames. Where the relay cannot start (no Python at the
node's `python`, a crash) or the node's sshd forwards no Unix sockets (`AllowStreamLocalForwarding no`,
`DisableForwarding`), `trouble` says why and the transport goes on through the login shell, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from typing import Callable, Sequence

import asyncssh

from homegpu.remote.node_side import script
from homegpu.remote.nodes.login_time import LoginTiming
from homegpu.remote.nodes.transport_base import CommandResult, RemoteProcess, TransportError, cause

RELAY_SOURCE = script("command_relay")
START_TIMEOUT_S = 120.0  # past pyenv's 60 s wait on a stale lock: the relay is worth waiting for
GONE_WITHIN_S = 0.5  # a relay whose socket refuses a channel and whose own channel is still open then is alive
MAX_STARTS = 3  # a relay that keeps dying is given up on for the connection: the login shell it is
STDERR_KEPT = 1 << 20  # the end of a command's stderr kept (its start is the least telling part)
_FRAME = struct.Struct(">cI")


class RelayRefused(Exception):
    """The relay cannot take commands on this connection; the message says why."""


class RelayProcess(RemoteProcess):
    """One command through the relay: its channel to the relay's socket, read frame by frame."""

    def __init__(self, reader: asyncssh.SSHReader, writer: asyncssh.SSHWriter) -> None:
        self._reader, self._writer = reader, writer
        self._stdout = bytearray()  # stdout read past while looking for stderr or the end
        self._stderr = bytearray()
        self._ended = False
        self._answered = False  # a first frame came: the relay took the command
        self._status: int | None = None
        self._lost: BaseException | None = None  # the connection's loss, where the channel ended with one
        self._lock = asyncio.Lock()

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except (asyncssh.Error, OSError) as exc:
            raise TransportError(f"connection lost: {cause(exc)}") from exc

    def close_stdin(self) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            self._writer.write_eof()

    async def _frame(self) -> bool:
        """Read one frame into its place; False at the end (the exit status read, or the channel gone)."""
        if self._ended:
            return False
        try:
            kind, size = _FRAME.unpack(await self._reader.readexactly(_FRAME.size))
            data = await self._reader.readexactly(size)
        except asyncio.IncompleteReadError:
            self._ended = True  # no status: the relay closed the channel without one
            return False
        except (asyncssh.Error, OSError) as exc:
            self._ended, self._lost = True, exc  # no status: the link died
            return False
        self._answered = True
        if kind == b"O":
            self._stdout += data
        elif kind == b"E":
            self._stderr += data
            del self._stderr[:-STDERR_KEPT]
        elif kind == b"X":
            status = struct.unpack(">i", data)[0]
            self._status, self._ended = (status if status >= 0 else -1), True  # a signal: -1, as asyncssh says
            return False
        return True

    async def started(self) -> bool:
        """Whether the relay took the command (its first frame: started, or why not); False: it never will."""
        async with self._lock:
            while not self._answered and await self._frame():
                pass
            return self._answered

    async def read_chunk(self) -> bytes:
        """The next output, b"" at its end. Raises TransportError where the connection was lost, as SshProcess."""
        async with self._lock:
            while not self._stdout and await self._frame():
                pass
            if not self._stdout and self._lost is not None:
                raise TransportError(f"connection lost: {cause(self._lost)}")
            chunk, self._stdout = bytes(self._stdout), bytearray()
            return chunk

    async def _to_end(self, keep_stdout: bool) -> None:
        async with self._lock:
            while await self._frame():
                if not keep_stdout:
                    self._stdout.clear()

    async def stderr_text(self) -> str:
        await self._to_end(keep_stdout=True)
        return self._stderr.decode("utf-8", "replace")

    async def wait(self) -> int | None:
        await self._to_end(keep_stdout=False)
        return self._status

    def terminate(self) -> None:
        self._writer.close()


async def open_command(conn: asyncssh.SSHClientConnection, socket: str, argv: Sequence[str]) -> RelayProcess:
    """argv started by the relay listening at `socket`. Raises RelayRefused when no channel to it opens."""
    try:
        reader, writer = await conn.open_unix_connection(socket)
    except asyncssh.ChannelOpenError as exc:
        raise RelayRefused(f"its sshd opens no channel to the relay's Unix socket ({cause(exc)}): "
                           "AllowStreamLocalForwarding or DisableForwarding in its sshd_config") from None
    writer.write(json.dumps({"argv": list(argv)}).encode() + b"\n")
    process = RelayProcess(reader, writer)
    if not await process.started():  # the relay is gone (ended as the channel opened): the command never ran
        process.terminate()
        raise RelayRefused("the relay ended before it started the command")
    return process


async def run_command(conn: asyncssh.SSHClientConnection, socket: str, argv: Sequence[str],
                      input: bytes | None) -> CommandResult:
    """argv run to its end by the relay, as transport.run() answers. Raises RelayRefused, TransportError."""
    process = await open_command(conn, socket, argv)
    try:
        if input:
            process.write(input)
            await process.drain()
        process.close_stdin()
        stdout = bytearray()
        while chunk := await process.read_chunk():
            stdout += chunk
        stderr = await process.stderr_text()
        status = await process.wait()
    finally:
        process.terminate()
    if status is None:
        raise TransportError(f"connection failed during {argv[0]}: connection lost")
    return CommandResult(status, stdout.decode("utf-8", "replace"), stderr)


class Relay:
    """The relay of one SSH connection: started on first use, once (a crash starts it again, MAX_STARTS at
    most), shared by every command; `trouble` once it cannot be had, and then never tried again."""

    def __init__(self, conn: asyncssh.SSHClientConnection, python: str, framed: Callable[[Sequence[str]], str],
                 mark: bytes, heard_banner: Callable[[bytes], None]) -> None:
        self._conn, self._python, self._framed, self._mark = conn, python, framed, mark
        self._heard_banner = heard_banner
        self._starting: asyncio.Task | None = None
        self._process: asyncssh.SSHClientProcess | None = None
        self._watch: asyncio.Task | None = None
        self._starts = 0
        self.trouble = ""
        self.login: LoginTiming | None = None  # the login the relay's start paid: timed, with its stderr
        self._login_began: float | None = None

    @property
    def socket_path(self) -> str:
        """Where the relay listens on the node while it is up ("" otherwise)."""
        up = self._starting is not None and self._starting.done() and not self._gone()
        return self._starting.result() if up else ""

    @property
    def login_waiting(self) -> float | None:
        """Seconds the relay's login has been waited for so far (None: not waiting)."""
        return None if self._login_began is None else time.monotonic() - self._login_began

    async def socket(self) -> str | None:
        """The relay's socket, started if need be; None: commands go through the login shell (see trouble)."""
        if self.trouble:
            return None
        if self._starting is None or (self._starting.done() and self._gone()):
            if self._starts >= MAX_STARTS:
                self.give_up(f"the relay ended {self._starts} times")
                return None
            self._starts += 1
            self._starting = asyncio.ensure_future(self._start())
        try:
            return await asyncio.shield(self._starting)
        except RelayRefused as exc:
            self.give_up(str(exc))
            return None

    def _gone(self) -> bool:
        return self._starting.cancelled() or self._starting.exception() is not None or self._process is None

    async def refused(self, why: str) -> None:
        """No channel to the socket opened (OpenSSH says "open failed" either way): the relay has ended, and the
        next command starts another; or, while it still runs, the node's sshd forwards no Unix sockets: given up."""
        if self._watch is not None:
            await asyncio.wait({self._watch}, timeout=GONE_WITHIN_S)  # a relay that ended: its channel closes
        if self._process is not None:
            self.give_up(why)

    def give_up(self, why: str) -> None:
        """Commands go through the login shell from now on, for `why`."""
        self.trouble = self.trouble or why
        self.close()

    async def _start(self) -> str:
        """Start the relay through the login shell; its socket's path. Raises RelayRefused."""
        self._login_began = time.monotonic()
        try:
            process = await self._conn.create_process(self._framed([self._python, "-c", RELAY_SOURCE]),
                                                      encoding=None)
        except (asyncssh.Error, OSError) as exc:
            self._login_began = None
            raise RelayRefused(f"cannot start the relay: {cause(exc)}") from None
        self._login_began = time.monotonic()  # the login's own time: from its start, as login_probe times it
        stderr = bytearray()
        drain = asyncio.ensure_future(_drain(process.stderr, stderr))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                path = await self._hello(process, stderr)
        except (TimeoutError, asyncssh.Error, OSError, ValueError) as exc:
            drain.cancel()
            process.close()
            said = stderr.decode("utf-8", "replace").strip().splitlines()
            raise RelayRefused(f"the relay did not start ({said[-1] if said else cause(exc)})") from None
        finally:
            self._login_began = None
        self._process = process
        self._watch = asyncio.ensure_future(self._until_gone(process, drain))
        return path

    async def _hello(self, process: asyncssh.SSHClientProcess, stderr: bytearray) -> str:
        """The login timed to its marker, then the relay's line naming its socket."""
        head = b""
        while self._mark not in head:
            chunk = await process.stdout.read(4096)
            if not chunk:
                raise ValueError("it exited before its login was done")
            head += chunk
        banner, _, rest = head.partition(self._mark)
        waited = time.monotonic() - self._login_began
        for _ in range(200):  # stderr's own marker, written right after stdout's: what the login said is before it
            if self._mark in stderr:
                break
            await asyncio.sleep(0.01)
        said = bytes(stderr).partition(self._mark)[0]
        self.login = LoginTiming(waited, said.decode("utf-8", "replace"), waited)
        self._heard_banner(banner + said)
        while b"\n" not in rest:
            chunk = await process.stdout.read(4096)
            if not chunk:
                raise ValueError(f"{self._python} exited without starting it")
            rest += chunk
        hello = json.loads(rest.partition(b"\n")[0])
        return str(hello["socket"])

    async def _until_gone(self, process: asyncssh.SSHClientProcess, drain: asyncio.Task) -> None:
        """Forget the relay once its channel ends, so the next command starts another."""
        with contextlib.suppress(asyncssh.Error, OSError):
            await process.wait_closed()
        drain.cancel()
        if self._process is process:
            self._process = None

    def close(self) -> None:
        for task in (self._starting, self._watch):
            if task is not None and not task.done():
                task.cancel()
        if self._process is not None:
            self._process.close()
            self._process = None


async def _drain(stream: asyncssh.SSHReader, into: bytearray) -> None:
    """Read a stream to its end, keeping its first bytes (the login's stderr, then the relay's own)."""
    with contextlib.suppress(asyncssh.Error, OSError):
        while chunk := await stream.read(4096):
            if len(into) < STDERR_KEPT:
                into += chunk
