"""homegpu.remote.queue: the queue serve runs: its entries kept in SQLite (ids never reused, a start recorded
before its launch), one run's `--set` settings checked as cluster.toml's, when each entry starts (pure), the
runner that starts them, and the Unix socket `submit`, `queue` and `cancel` reach it through.
"""

from __future__ import annotations

from homegpu.remote.queue.claim import ServeClaim
from homegpu.remote.queue.client import NoServe, QueueClient
from homegpu.remote.queue.desk import QueueDesk
from homegpu.remote.queue.entries import EntryState, QueueEntry, QueueError, entry_id, entry_number
from homegpu.remote.queue.location import queue_path
from homegpu.remote.queue.overrides import PER_RUN_KEYS, OverrideError, apply_overrides, parse_value
from homegpu.remote.queue.protocol import entry_fields
from homegpu.remote.queue.rendezvous import socket_path
from homegpu.remote.queue.resume import ATTACH, FAIL, Resume, resume_action
from homegpu.remote.queue.schedule import Decision, NodeView, decide, entry_nodes
from homegpu.remote.queue.runner import QueueRunner
from homegpu.remote.queue.schema import QueueDamaged
from homegpu.remote.queue.server import QueueServer, QueueService
from homegpu.remote.queue.store import MAX_PRIORITY, QueueStore

__all__ = [
    "ATTACH", "FAIL", "MAX_PRIORITY", "PER_RUN_KEYS", "Decision", "EntryState", "NoServe", "NodeView", "OverrideError",
    "QueueClient", "QueueDamaged", "QueueDesk", "QueueEntry", "QueueError", "QueueRunner", "QueueServer", "QueueService", "QueueStore", "Resume", "ServeClaim",
    "apply_overrides", "decide", "entry_fields", "entry_id", "entry_nodes", "entry_number", "parse_value", "queue_path",
    "resume_action", "socket_path",
]
