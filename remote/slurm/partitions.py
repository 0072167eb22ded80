"""The cluster's partitions as sinfo lists them: each one's name, time limit and nodes, and which of its
nodes are down, so a refusal can name the partitions there are and the limit that was passed.

sinfo prints a partition once per node state ("debug|30:00|2|down*|node[2-3]" and "debug|30:00|1|idle|node1");
`parse_sinfo` folds those rows into one Partition each, in sinfo's order.
"""

from __future__ import annotations

from dataclasses import dataclass

from homegpu.remote.config import time_limit_seconds
from homegpu.remote.slurm.hostlist import HostlistError, compress, expand

SINFO_FORMAT = "%P|%l|%D|%T|%N"  # partition (the default marked *), time limit, node count, state, nodes
_UNAVAILABLE = ("down", "drain", "drained", "draining", "fail", "failing", "future", "inval", "maint",
                "not_responding", "power_down", "powered_down", "reboot_issued", "unknown")


class SinfoError(ValueError):
    """A line that is not what homegpu's sinfo format prints."""


@dataclass(frozen=True)
class Partition:
    """One partition: its name, its time limit as Slurm prints it ("30:00", "infinite"), its nodes, and
    those of them that cannot run a job now."""

    name: str
    time_limit: str
    nodes: tuple[str, ...]
    unavailable: tuple[str, ...] = ()
    default: bool = False  # where a job that names no partition goes

    @property
    def time_limit_seconds(self) -> int | None:
        """Its limit in seconds, None for none ("infinite", "n/a")."""
        return time_limit_seconds(self.time_limit)

    @property
    def unavailable_text(self) -> str:
        return compress(list(self.unavailable))


def sinfo_argv() -> list[str]:
    """The sinfo command whose output `parse_sinfo` reads."""
    return ["sinfo", "--noheader", f"--format={SINFO_FORMAT}"]


def parse_sinfo(text: str) -> list[Partition]:
    """Each partition of sinfo's output in SINFO_FORMAT, its rows folded. Raises SinfoError."""
    found: dict[str, dict] = {}
    for line in filter(str.strip, text.splitlines()):
        fields = line.split("|")
        if len(fields) != 5 or not fields[2].isdigit():
            raise SinfoError(f"sinfo printed {line[:80]!r}, not the 5 fields homegpu asked for")
        marked, limit, _count, state, nodelist = fields
        name = marked.removesuffix("*")
        try:
            nodes = expand(nodelist) if nodelist else []
        except HostlistError as exc:
            raise SinfoError(f"sinfo printed a node list homegpu cannot read: {exc}") from None
        entry = found.setdefault(name, {"time_limit": limit, "nodes": [], "unavailable": [],
                                        "default": marked.endswith("*")})
        entry["nodes"] += nodes
        if _is_unavailable(state):
            entry["unavailable"] += nodes
    return [Partition(name, entry["time_limit"], tuple(entry["nodes"]), tuple(entry["unavailable"]), entry["default"])
            for name, entry in found.items()]


def _is_unavailable(state: str) -> bool:
    """sinfo's long state ("down*", "drained", "idle~", "mixed") names a node that cannot start a job now."""
    return state.rstrip("*~#!%$@^-+").lower() in _UNAVAILABLE


def partition_for(partitions: list[Partition], partition: str) -> Partition | None:
    """The partition a job's `partition` key sends it to: the first it lists, else the default one."""
    if partition:
        return next((found for found in partitions if found.name == partition.split(",")[0]), None)
    return next((found for found in partitions if found.default), None)
