"""What `submit`, `queue` and `cancel` say to serve over its socket: one JSON request per connection,
one JSON reply, each a single line of at most MAX_LINE bytes. Entries travel as their fields.

Requests: {"op": "submit", "job": J, "after": [...], "priority": N, "set": [...]}, {"op": "list"},
{"op": "cancel", "id": "q-3"}. Replies: {"ok": true, "entry": {...}} or {"ok": true, "entries": [...]},
else {"ok": false, "error": "one line"}.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from homegpu.remote.queue.entries import EntryState, QueueEntry, QueueError

MAX_LINE = 1 << 20  # a listing of thousands of entries fits; anything bigger is not homegpu's
OPS = ("submit", "list", "cancel")


def entry_fields(entry: QueueEntry) -> dict[str, Any]:
    fields = asdict(entry)
    fields["state"] = entry.state.value
    return fields


def entry_from_fields(fields: dict[str, Any]) -> QueueEntry:
    try:
        return QueueEntry(**{**fields, "state": EntryState(fields["state"]),
                             "overrides": tuple(fields["overrides"]), "after": tuple(fields["after"])})
    except (KeyError, TypeError, ValueError) as exc:
        raise QueueError(f"serve sent an entry this homegpu cannot read ({exc}); are both the same version?") from None


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    """The message of one line. Raises QueueError when it is not one."""
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        message = None
    if not isinstance(message, dict):
        raise QueueError("not a homegpu queue message (one JSON object per line)")
    return message
