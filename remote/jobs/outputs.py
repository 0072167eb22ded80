"""Bring home what the chief wrote in its output dir: a saved model, TensorBoard logs, anything.

Backups are not fetched (they are how a restart resumes, and can be large), and neither is what
goes past a size cap; what was left out is said, so the run's last line lists only what is here.
What a run that did not succeed wrote may be cut short (a full disk, a killed worker): it comes home
marked partial, with PARTIAL.txt beside it saying why.
Once a built-in trainer's run succeeded and its outputs are home, the workers' backups have no use
left and are removed from the nodes (a user's own script keeps its backups where it put them).
"""

from __future__ import annotations

import asyncio
import posixpath
from dataclasses import dataclass
from pathlib import Path

from homegpu.remote.jobs.backup_copy import BACKUP_DIR, SNAPSHOT
from homegpu.remote.nodes import NODE_GONE, NodeSession, cause

OUTPUT_CAP_BYTES = 2 << 30  # 2 GiB: a home link moves that in a few seconds to minutes
# BackupAndRestore's dir (ours and the tutorial's), and the snapshot a copy of it in flight sends from
SKIP_DIRS = frozenset({BACKUP_DIR, SNAPSHOT, "__pycache__"})
PARTIAL_NOTE = "PARTIAL.txt"


@dataclass(frozen=True)
class FetchedOutputs:
    """What fetch_outputs brought (top-level names and bytes) and what it left on the node, with why."""

    fetched: tuple[str, ...] = ()
    size: int = 0
    left: tuple[str, ...] = ()  # "NAME (why)"
    error: str = ""
    partial: str = ""  # why the outputs may be incomplete (the run failed or was stopped), or ""


def plan_fetch(listing: dict[str, tuple[int, int]], cap: int) -> tuple[list[str], int, list[str]]:
    """(top-level entries to fetch, their bytes, entries left with why), in name order, within `cap`.

    `listing` maps every file's relative path to (size, mtime), skipped dirs already left out.
    """
    sizes: dict[str, int] = {}
    for rel, (size, _) in listing.items():
        top = rel.split("/", 1)[0]
        if not top.startswith("workertemp_"):  # the tutorial's non-chief save dirs
            sizes[top] = sizes.get(top, 0) + size
    fetch, total, left = [], 0, []
    for name in sorted(sizes):
        if total + sizes[name] > cap:
            left.append(f"{name} ({sizes[name] / 2**20:.0f} MiB, past the {cap / 2**30:g} GiB cap)")
        else:
            fetch.append(name)
            total += sizes[name]
    return fetch, total, left


async def fetch_outputs(node: NodeSession, remote_dir: str, local_dir: Path, cap: int = OUTPUT_CAP_BYTES,
                        unfinished: str = "") -> FetchedOutputs:
    """Copy the top-level entries of `remote_dir` on `node` into `local_dir`, skipping backups, up to `cap`;
    `unfinished`: why the run did not succeed (the copy is then marked partial)."""
    try:
        listing = await node.list_tree(remote_dir, SKIP_DIRS)
        fetch, total, left = plan_fetch(listing, cap)
        for name in fetch:
            await node.get_tree(posixpath.join(remote_dir, name), local_dir / name)
    except NODE_GONE as exc:
        return FetchedOutputs(error=f"{node.name}: could not fetch the outputs from {remote_dir}: {exc}")
    if fetch and unfinished:
        (local_dir / PARTIAL_NOTE).write_text(f"Partial: {unfinished}\nThese are the files the chief had "
                                              "written by then; any of them may be cut short.\n")
    return FetchedOutputs(tuple(fetch), total, tuple(left), partial=unfinished if fetch else "")


async def remove_backups(places: list[tuple[NodeSession, str]]) -> list[str]:
    """Delete `backup/` in each (node, worker output dir); "NODE: why" for each that could not be."""
    return await remove_folders([(node, posixpath.join(out_dir, "backup")) for node, out_dir in places])


async def remove_folders(places: list[tuple[NodeSession, str]]) -> list[str]:
    """Delete each (node, folder); "NODE: why" for each that could not be."""
    async def remove(node: NodeSession, folder: str) -> str:
        try:
            result = await node.run(["rm", "-rf", "--", folder], timeout=60)
        except NODE_GONE as exc:  # a command past its timeout is one too (CommandTimeout)
            return f"{node.name}: {cause(exc)}"
        return "" if result.ok else f"{node.name}: {result.stderr.strip()}"

    return [why for why in await asyncio.gather(*(remove(*place) for place in places)) if why]
