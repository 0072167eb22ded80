"""serve's end of the queue's socket (rendezvous.py says where): it answers `submit`, `queue` and `cancel`
for the one user serve runs as. The folder's 0700 keeps others from connecting at all; the peer's
credentials (SO_PEERCRED) are checked too, for root, whom no file mode stops. Nothing a request holds is
run: it becomes a queue entry, whose fields are checked as cluster.toml's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
from pathlib import Path
from typing import Any, Protocol

from homegpu.remote.queue.entries import QueueEntry, QueueError
from homegpu.remote.queue.protocol import MAX_LINE, OPS, decode, encode, entry_fields
from homegpu.remote.queue.rendezvous import private_folder, remove_private_folder, user_name

READ_TIMEOUT = 10.0  # a client that sends no whole line in this long is dropped


class QueueService(Protocol):
    """What the socket's requests do (the runner). Each raises QueueError with one line for the user."""

    def submit(self, job: str, after: list[str], priority: int, overrides: list[str], user: str) -> QueueEntry: ...
    def entries(self) -> list[QueueEntry]: ...
    def cancel(self, id_: str, user: str) -> QueueEntry: ...


class QueueServer:
    """Listens on `path` for `service`; start() it, close() it."""

    def __init__(self, path: Path, service: QueueService) -> None:
        self.path, self.service = Path(path), service
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> QueueServer:
        """Raises QueueError: the folder is not safe, or another serve already listens there."""
        private_folder(self.path.parent)
        if await _answers(self.path):
            raise QueueError(f"another homegpu serve already runs this cluster's queue (its socket {self.path} "
                             "answers); stop it first, or use it")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket left by a serve that was killed
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.path), limit=MAX_LINE)
        os.chmod(self.path, 0o600)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            remove_private_folder(self.path.parent)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            reply = await self._reply(reader, writer.get_extra_info("socket"))
            writer.write(encode(reply))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _reply(self, reader: asyncio.StreamReader, sock: socket.socket) -> dict[str, Any]:
        uid = peer_uid(sock)
        try:
            line: bytes | None = await asyncio.wait_for(reader.readline(), READ_TIMEOUT)
        except (asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError):
            line = None
        # Another user is refused only once its request is read: a socket closed with bytes unread resets the
        # peer's end, and the peer would see "Connection lost" rather than why.
        if uid != os.getuid():
            return {"ok": False, "error": f"this queue is {user_name(os.getuid())}'s (homegpu serve runs as them); "
                                          f"{user_name(uid)} may not submit, list or cancel here"}
        unread = {"ok": False, "error": f"no whole request within {READ_TIMEOUT:g} s or {MAX_LINE} bytes"}
        if line is None:
            return unread
        try:
            return self._answer(decode(line), user_name(uid))
        except QueueError as exc:
            return {"ok": False, "error": str(exc)}
        except ValueError:
            return unread

    def _answer(self, request: dict[str, Any], user: str) -> dict[str, Any]:
        op = request.get("op")
        if op not in OPS:
            raise QueueError(f"unknown request {str(op)[:40]!r}; this serve knows {', '.join(OPS)}")
        if op == "list":
            return {"ok": True, "entries": [entry_fields(entry) for entry in self.service.entries()]}
        if op == "cancel":
            return {"ok": True, "entry": entry_fields(self.service.cancel(_text(request, "id"), user))}
        entry = self.service.submit(_text(request, "job"), _texts(request, "after"), _number(request, "priority"),
                                    _texts(request, "set"), user)
        return {"ok": True, "entry": entry_fields(entry)}


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux's SO_PEERCRED: pid, uid, gid)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


async def _answers(path: Path) -> bool:
    """Something listens on the socket at `path`."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), 2.0)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


def _text(request: dict[str, Any], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value:
        raise QueueError(f"the request has no {key}")
    return value


def _texts(request: dict[str, Any], key: str) -> list[str]:
    value = request.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise QueueError(f"the request's {key} is not a list of texts")
    return value


def _number(request: dict[str, Any], key: str) -> int:
    value = request.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool):
        raise QueueError(f"the request's {key} is not a whole number")
    return value
