"""What a script's chief wrote in its working dir, carried to every other worker before a restart.

A script written for a shared filesystem saves its checkpoint on its chief alone and has every process load it
where the file exists (pytorch/examples' ddp-tutorial-series: `if self.global_rank == 0 ...: _save_snapshot`).
On machines with their own disks the other workers find none after a restart, start over, and the ranks drift
apart. So, as backup_copy.py does for TensorFlow's backup, homegpu keeps a copy of the chief's files on the
controller (experiments/RUN-ID/chief-checkpoint/): the job's `checkpoint` (a file or folder), else everything the
chief wrote in its working dir (its output dir, fresh for each run) but the backup BackupCopy keeps and
MultiWorkerMirroredStrategy's `workertemp_*` dirs. It is taken after each epoch the chief finishes and again when
a generation ends, and put into every worker's working dir before the next one. A worker's other files are left
alone; a file the copy held before and the chief removed since is removed too (a script that keeps its last N).

A copy is taken file by file into a folder beside it, checked against a second listing (a file the chief was
saving meanwhile waits for the next copy), and then put in its place, each file with the chief's mtime, so that
putting it back on the chief sends nothing.
"""

from __future__ import annotations

import os
import posixpath
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from homegpu.remote.jobs.backup_copy import BACKUP_DIR, COPY_CAP_BYTES, SNAPSHOT, gone_or_mid_save
from homegpu.remote.jobs.codesync import SyncError, read_tree, sync_trees
from homegpu.remote.nodes import NODE_GONE, NodeSession, format_bytes

SKIP = frozenset({BACKUP_DIR, SNAPSHOT, "__pycache__"})  # never carried: BackupCopy carries the backup
WORKER_TEMP = "workertemp_"  # MultiWorkerMirroredStrategy's non-chief save dirs (never the chief's to carry)


class CheckpointCopy:
    """The copy of one run's chief checkpoint in `folder`, as BackupKeeper keeps it (take, put, epoch, refused).

    `checkpoint`: the job's key ("" for everything the chief wrote). After a take, `files` are what the copy holds
    and `left` what the chief's working dir holds that `checkpoint` leaves out."""

    what = "checkpoint"

    def __init__(self, folder: Path, checkpoint: str = "", cap: int = COPY_CAP_BYTES) -> None:
        self.folder, self.checkpoint, self.cap = folder, checkpoint.strip("/"), cap
        self.epoch: int | None = None
        self.refused = ""  # why copies stopped (too large), said once
        self.files: tuple[str, ...] = ()
        self.left: tuple[str, ...] = ()
        self._held: set[str] = set()  # every file a copy held: put removes those the chief removed since

    def carries(self, rel: str) -> bool:
        """Whether the file `rel` (relative to the chief's working dir) is the checkpoint's."""
        if self.checkpoint:
            return rel == self.checkpoint or rel.startswith(self.checkpoint + "/")
        return not rel.startswith(WORKER_TEMP)

    async def take(self, node: NodeSession, remote_dir: str, epoch: int) -> str:
        """Copy the checkpoint from the working dir `remote_dir` on `node` as that of `epoch`; why not ("" when
        copied, when there is nothing to copy, or when the chief was saving: the next copy will do; MID_SAVE when
        the node failed it while there)."""
        try:
            listing = await node.list_tree(remote_dir, SKIP)
        except NODE_GONE:  # a file the chief removed as find walked it (tried again shortly), or the node is gone
            return gone_or_mid_save(node)
        chosen = {rel: entry for rel, entry in listing.items() if self.carries(rel)}
        self.left = tuple(sorted(set(listing) - set(chosen)))
        if not chosen or self.refused:
            return ""
        size = sum(size for size, _ in chosen.values())
        if size > self.cap:  # an older copy would put an older epoch over a worker's own: let it go too
            self.discard()
            self.epoch, self.files = None, ()
            self.refused = (f"the chief's checkpoint is {format_bytes(size)}, past the {format_bytes(self.cap)} "
                            "homegpu carries to the other workers; name the files they resume from with the job's "
                            "checkpoint key")
            return self.refused
        partial = self.folder.with_name(self.folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            for rel in sorted(chosen):
                await node.get_tree(posixpath.join(remote_dir, rel), partial / rel)
            again = await node.list_tree(remote_dir, SKIP)
        except NODE_GONE:
            shutil.rmtree(partial, ignore_errors=True)
            return gone_or_mid_save(node)
        if any(again.get(rel) != entry for rel, entry in chosen.items()):  # saved meanwhile: the next copy will do
            shutil.rmtree(partial, ignore_errors=True)
            return ""
        for rel, (_, mtime) in chosen.items():
            os.utime(partial / rel, (mtime, mtime))
        shutil.rmtree(self.folder, ignore_errors=True)
        partial.rename(self.folder)
        self.epoch, self.files = epoch, tuple(sorted(chosen))
        self._held.update(chosen)
        return ""

    async def put(self, targets: Sequence[tuple[NodeSession, str]]) -> list[str]:
        """Put the copy into each (node, working dir), leaving the worker's other files alone; "NODE: why" for
        each that failed."""
        if self.epoch is None:
            return []
        try:
            tree = await read_tree(self.folder)
        except SyncError as exc:
            return [f"the copy of the chief's checkpoint: {exc}"]
        mine, dirs = set(tree.files) | self._held, set(tree.dirs)
        return await sync_trees(replace(tree, leaves_out=lambda rel, is_dir: rel not in (dirs if is_dir else mine)),
                                targets)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
