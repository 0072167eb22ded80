"""A node's events: its session's state, and the stats agent's snapshots (or why there are none)."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from homegpu.remote.events.stats import NodeStats


class NodeState(str, enum.Enum):
    CONNECTING = "connecting"
    ONLINE = "online"
    OFFLINE = "offline"
    AUTH_FAILED = "auth failed"
    HOST_KEY_UNKNOWN = "host key unknown"
    HOST_KEY_CHANGED = "host key changed"
    ASLEEP = "asleep"  # homegpu put it to sleep (nodes/asleep.py): not a fault, woken when work needs it

    @property
    def needs_user(self) -> bool:
        """States that retrying alone cannot fix: the user must act (trust, fix keys)."""
        return self in (NodeState.AUTH_FAILED, NodeState.HOST_KEY_UNKNOWN, NodeState.HOST_KEY_CHANGED)


@dataclass(frozen=True)
class NodeStateChanged:
    node: str
    state: NodeState
    reason: str = ""
    fingerprint: str = ""
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class NodeStatsUpdated:
    node: str
    stats: NodeStats
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class NodeStatsUnavailable:
    """The node is online but its stats agent could not run (no python3, say)."""

    node: str
    reason: str
    at: float = field(default_factory=time.time)
