"""The commands' end of serve's queue socket: one request, one reply, every failure one line.

Without a serve (no socket, or one left by a serve that was killed) the error says how to start one; a
socket of another user's serve says whose it is. Used by `homegpu submit/queue/cancel` and the TUI.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

from homegpu.remote.queue.entries import QueueEntry, QueueError
from homegpu.remote.queue.protocol import MAX_LINE, decode, encode, entry_from_fields
from homegpu.remote.queue.rendezvous import owner_of

REPLY_TIMEOUT = 30.0


class NoServe(QueueError):
    """No serve answers for this cluster: the queue cannot be reached (the message says how to start one)."""


class QueueClient:
    """Talks to the serve listening at `path`. `serve_command` is how the user starts it ("homegpu serve")."""

    def __init__(self, path: Path, serve_command: str = "homegpu serve") -> None:
        self.path, self.serve_command = Path(path), serve_command

    async def submit(self, job: str, after: Sequence[str] = (), priority: int = 0,
                     overrides: Sequence[str] = ()) -> QueueEntry:
        reply = await self._ask({"op": "submit", "job": job, "after": list(after), "priority": priority,
                                 "set": list(overrides)})
        return entry_from_fields(reply["entry"])

    async def entries(self) -> list[QueueEntry]:
        reply = await self._ask({"op": "list"})
        return [entry_from_fields(fields) for fields in reply["entries"]]

    async def cancel(self, id_: str) -> QueueEntry:
        return entry_from_fields((await self._ask({"op": "cancel", "id": id_}))["entry"])

    async def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """serve's reply to `request`. Raises NoServe, or QueueError with serve's own words."""
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path), limit=MAX_LINE)
        except (FileNotFoundError, ConnectionRefusedError):
            raise NoServe(f"no homegpu serve runs this cluster's queue (nothing answers at {self.path}); start "
                          f"one with `{self.serve_command}` (docs/always-on.md), then try again") from None
        except PermissionError:
            owner = owner_of(self.path.parent)
            whose = f"{owner}'s" if owner else "another user's"
            raise QueueError(f"this cluster's queue is {whose} (its serve's socket {self.path} is closed to "
                             "others); ask them to submit, or run a serve of your own with a cluster file of "
                             "your own") from None
        except OSError as exc:
            raise NoServe(f"cannot reach serve at {self.path} ({exc.strerror or exc}); is `{self.serve_command}` "
                          "running?") from None
        try:
            writer.write(encode(request))
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), REPLY_TIMEOUT)
        except (ConnectionError, asyncio.TimeoutError, ValueError) as exc:
            raise QueueError(f"serve at {self.path} did not answer ({exc or 'timed out'}); is it stuck? "
                             "its own output says more") from None
        finally:
            writer.close()
        reply = decode(line) if line else {"ok": False, "error": "serve closed the connection without an answer"}
        if not reply.get("ok"):
            raise QueueError(str(reply.get("error") or "serve refused the request"))
        return reply
