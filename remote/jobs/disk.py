"""A full disk on a node, told apart from a script error or a crash.

A worker that writes into a full disk fails with "No space left on device" (errno 28), and so does every
restart; its log, on that disk too, may end mid-line and its supervisor may not record its exit. So when
a generation fails, the run measures each failed worker's run dir on its node (node_side/scripts/disk_space.py):
a disk with less than LOW_DISK_MB left, or a worker whose supervisor or log met ENOSPC, ends the run
with the node, the filesystem, the room left and the fix.
"""

from __future__ import annotations

import asyncio
from typing import Iterable

from homegpu.remote.jobs.watch import WorkerTrack
from homegpu.remote.net import json_object
from homegpu.remote.node_side import script
from homegpu.remote.nodes import NODE_GONE

LOW_DISK_MB = 16  # below this a disk counts as full: a checkpoint or a log line no longer fits
NO_SPACE = ("No space left on device", "Errno 28", "Disk quota exceeded")
COMMAND_TIMEOUT = 30.0


def said_no_space(track: WorkerTrack) -> bool:
    """The worker's supervisor recorded ENOSPC, or its last log lines say it ran out of room."""
    lines = track.last_lines()
    return bool(track.status and track.status.nospace) or any(m in line for line in lines for m in NO_SPACE)


def describe_full(node: str, space: dict) -> str:
    """The one line for a full disk, from what disk_space.py said of it."""
    return (f"{node}: no space left on {space.get('device')} ({space.get('fstype')} at {space.get('mount')}: "
            f"{space.get('free_mb')} MB free of {space.get('total_mb')} MB), which holds {space.get('path')}; free "
            "some space there, or set work_dir in cluster.toml to a disk with room, then run again")


async def full_disks(tracks: Iterable[WorkerTrack], run_id: str) -> list[str]:
    """One line per node of a failed worker whose disk is full; [] when none is (or cannot be measured)."""
    failed = {}
    for track in tracks:
        if track.ended and track.status.exit_status != 0:
            failed.setdefault(track.runtime.node.name, []).append(track)
    found = await asyncio.gather(*(_full(group, run_id) for group in failed.values()))
    return [line for line in found if line]


async def _full(tracks: list[WorkerTrack], run_id: str) -> str:
    runtime = tracks[0].runtime
    node = runtime.node
    try:
        result = await node.run([node.spec.python, "-c", script("disk_space"), runtime.run_dir(run_id)],
                                timeout=COMMAND_TIMEOUT)
    except NODE_GONE:
        return ""  # the node is away: the restart waits for it
    space = json_object(result.stdout.strip().splitlines()[-1]) if result.ok and result.stdout.strip() else None
    if not space:
        return ""
    if space.get("free_mb", LOW_DISK_MB) < LOW_DISK_MB or any(said_no_space(t) for t in tracks):
        return describe_full(node.name, space)
    return ""
