"""A node's events: its session's state, and the stats agent's snapshots with what holds its GPUs back (or why
there are no snapshots)."""

from __future__ import annotations

import enum
import time
from collections.abc import Collection
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
class HeldBack:
    """What holds a node's GPUs back, as its session judged its stats lines (nodes/health.py's GpuHealth, the one
    judgement): each GPU's sentences by its index. Every reader (the TUI, the web view) reads it, never judges."""

    by_gpu: tuple[tuple[int, tuple[str, ...]], ...] = ()

    def causes(self, indices: Collection[int] | None = None) -> list[str]:
        """The sentences of every GPU, or only those of `indices` (a worker's GPUs on the node)."""
        return [cause for index, causes in self.by_gpu if indices is None or index in indices for cause in causes]


@dataclass(frozen=True)
class NodeStatsUpdated:
    """A stats line of the node, and what holds its GPUs back judged with it (`held_back`)."""

    node: str
    stats: NodeStats
    at: float = field(default_factory=time.time)
    held_back: HeldBack = HeldBack()


@dataclass(frozen=True)
class NodeStatsUnavailable:
    """The node is online but its stats agent could not run (no python3, say)."""

    node: str
    reason: str
    at: float = field(default_factory=time.time)
