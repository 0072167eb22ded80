"""The chief's last finished backup, kept off the chief: the run goes on from it when the chief's machine leaves.

Every worker resumes from `backup/` in its output dir ($HOMEGPU_BACKUP_DIR): the built-in trainer's
NodeLocalBackup, and a script's `BackupAndRestore(os.environ["HOMEGPU_BACKUP_DIR"])`. Stock BackupAndRestore
saves only on the chief, into `backup/chief/`, and every worker restores from its own `backup/chief/`: on
machines with their own disks a non-chief worker finds nothing, and a chief that leaves takes the only copy.
So homegpu keeps one on the controller (experiments/RUN-ID/chief-backup/): taken from the chief after each
epoch it finishes (the epoch line follows the save), bounded in size, and put onto every worker before each
new generation (refreshed from the chief first where its machine is still there), so that all of them,
a new chief or a machine that rejoins included, resume from the same epoch.

A copy is taken whole into a folder beside it and then put in its place, so a copy cut off half-way (the chief
gone mid-transfer) leaves the previous one. It is sent from a hard-linked snapshot the node makes in moments
(SNAPSHOT): on a busy machine sending the folder itself can take longer than an epoch, and the chief's next save,
which replaces and removes files, broke copy after copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import re
import shutil
from pathlib import Path
from typing import AsyncIterator, Callable, Protocol, Sequence

from homegpu.remote.jobs.codesync import SyncError, read_tree, sync_trees
from homegpu.remote.nodes import NODE_GONE, NodeSession, format_bytes

BACKUP_DIR = "backup"  # in a worker's output dir
SNAPSHOT = ".homegpu-backup-copy"  # beside it, while a copy is sent
# A TensorFlow checkpoint dir's index file names the newest checkpoint: model_checkpoint_path: "ckpt-3"
NEWEST_CHECKPOINT = re.compile(r'^model_checkpoint_path: "([^"/]+)"$', re.M)
COPY_CAP_BYTES = 2 << 30  # 2 GiB: past that, copying it every epoch would cost more than the epoch is worth
# take()'s answer for a copy that caught the chief mid-save: tried again shortly, not an epoch later (an epoch can be
# an hour, and the chief's machine may leave in it)
MID_SAVE = "copied while the chief saved it"
MID_SAVE_TRIES, MID_SAVE_WAIT_S = 5, 1.0
SNAPSHOT_TIMEOUT_S = 60.0


def backup_dir(output_dir: str) -> str:
    """A worker's backup dir on its node, from its output dir."""
    return posixpath.join(output_dir, BACKUP_DIR)


def gone_or_mid_save(node: NodeSession) -> str:
    """Why a copy from `node` failed half-way: MID_SAVE where the node is still there (a file the chief's next save
    replaced as it was read: tried again shortly), else "" (the node is gone: the last copy stands, and the run says
    the node left)."""
    return MID_SAVE if node.transport is not None else ""


@contextlib.asynccontextmanager
async def snapshot(node: NodeSession, remote_dir: str) -> AsyncIterator[str]:
    """A hard-linked copy of `remote_dir` beside it for the block, made in moments: a TensorFlow save writes new files
    and renames them over or removes the old, never changing one in place, so the links keep the files of the save
    that was whole while the copy is sent. `remote_dir` itself where the node could not link them (a filesystem
    without hard links, a file removed as cp walked the folder): complete() then tells a copy caught mid-save.

    Raises:
        NODE_GONE: the node is gone."""
    still = posixpath.join(posixpath.dirname(remote_dir.rstrip("/")), SNAPSHOT)
    linked = await node.run(["sh", "-c", 'rm -rf -- "$2" && exec cp -al -- "$1" "$2"', "sh", remote_dir, still],
                            timeout=SNAPSHOT_TIMEOUT_S)
    try:
        yield still if linked.ok else remote_dir
    finally:
        with contextlib.suppress(*NODE_GONE):
            await node.run(["rm", "-rf", "--", still], timeout=SNAPSHOT_TIMEOUT_S)


def complete(folder: Path) -> bool:
    """Whether every TensorFlow checkpoint dir in `folder` holds the checkpoint its index file names (its .index
    and a data shard): a copy taken while the chief was saving may hold the new index and not yet its files."""
    for index in folder.rglob("checkpoint"):
        match = NEWEST_CHECKPOINT.search(index.read_text(errors="replace"))
        if match and not ((index.parent / f"{match[1]}.index").exists()
                          and any(index.parent.glob(f"{match[1]}.data-*"))):
            return False
    return True


class BackupCopy:
    """The copy of one run's chief backup in `folder`; `epoch`: the epoch it holds (None: no copy yet)."""

    what = "backup"

    def __init__(self, folder: Path, cap: int = COPY_CAP_BYTES) -> None:
        self.folder, self.cap = folder, cap
        self.epoch: int | None = None
        self.refused = ""  # why copies stopped (too large), said once

    async def take(self, node: NodeSession, remote_dir: str, epoch: int) -> str:
        """Copy `remote_dir` from `node` as the backup of `epoch`; why not ("" when copied, when there is no
        backup to copy (a script that keeps none) or the node left; MID_SAVE when it caught the chief saving or the
        node failed it while there)."""
        try:
            listing = await node.list_tree(remote_dir, frozenset())
        except NODE_GONE:  # a file the chief's save removed as find walked it, or the node is gone
            return gone_or_mid_save(node)
        size = sum(size for size, _ in listing.values())
        if not listing or self.refused:
            return ""
        if size > self.cap:
            self.refused = (f"the chief's backup is {format_bytes(size)}, past the {format_bytes(self.cap)} homegpu "
                            "copies off the chief; if its machine leaves, the run cannot go on from it")
            return self.refused
        partial = self.folder.with_name(self.folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            async with snapshot(node, remote_dir) as still:
                await node.get_tree(still, partial)
        except NODE_GONE:
            shutil.rmtree(partial, ignore_errors=True)
            return gone_or_mid_save(node)
        if not complete(partial):  # copied while the chief saved
            shutil.rmtree(partial, ignore_errors=True)
            return MID_SAVE
        shutil.rmtree(self.folder, ignore_errors=True)
        partial.rename(self.folder)
        self.epoch = epoch
        return ""

    async def put(self, targets: Sequence[tuple[NodeSession, str]]) -> list[str]:
        """Make each (node, backup dir) the copy, as `rsync --delete` would; "NODE: why" for each that failed."""
        if self.epoch is None:
            return []
        try:
            tree = await read_tree(self.folder)
        except SyncError as exc:
            return [f"the copy of the chief's backup: {exc}"]
        return await sync_trees(tree, targets)

    def discard(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class Copy(Protocol):
    """What a BackupKeeper keeps up to date: a BackupCopy, or a script's CheckpointCopy (checkpoint_copy.py)."""

    what: str  # what it copies, for what the run says ("backup", "checkpoint")
    epoch: int | None
    refused: str

    async def take(self, node: NodeSession, remote_dir: str, epoch: int) -> str: ...

    async def put(self, targets: Sequence[tuple[NodeSession, str]]) -> list[str]: ...

    def discard(self) -> None: ...


# Where the newest backup is now, best first: (a node, its backup dir, the epochs it finished) for the chief and, where
# every worker keeps the same backup (the built-in trainer), the others; none whose node is away. One that finished no
# epoch yet (0: a script's chief that prints none) is copied only before a new generation, never after each epoch.
BackupSources = Callable[[], "list[tuple[NodeSession, str, int]]"]


class BackupKeeper:
    """Keeps a run's BackupCopy (or CheckpointCopy) up to date: a copy in the background after each epoch the chief
    finishes, and a fresh one before the copy is put onto the workers of a new generation. `say`: a line for the run
    (the cap)."""

    def __init__(self, copy: Copy, sources: BackupSources, say: Callable[[str], None]) -> None:
        self.copy, self._sources, self._say = copy, sources, say
        self._copying: asyncio.Task | None = None
        self._tried: int | None = None  # the epoch the last copy after an epoch was for: each is tried once
        self._failing = False  # the last copy failed (said once, until one is taken again)

    @property
    def epoch(self) -> int | None:
        return self.copy.epoch

    def after_epoch(self) -> None:
        """Start a copy when the chief finished an epoch not copied or tried yet (one copy at a time: each lists
        and copies on the chief's node, so an epoch whose copy found nothing or failed waits for the next)."""
        if self._copying is not None and not self._copying.done():
            return
        found = self._sources()[:1]  # the chief's: the copy follows it
        if found and found[0][2] and found[0][2] not in (self.copy.epoch, self._tried):
            self._tried = found[0][2]
            self._copying = asyncio.create_task(self._take(*found[0]))

    async def refresh(self) -> None:
        """The copy from the first source that gives one (the chief, else, for the built-in trainer, the next worker
        whose node is there). Only the workers of the generation that just ran hold the newest backup (a script's
        stock BackupAndRestore saves on its chief alone): refresh before the run's members change, never after."""
        if self._copying is not None:
            await asyncio.gather(self._copying, return_exceptions=True)
        self._tried = None  # the next generation may finish an epoch again that this one tried
        for node, remote_dir, epoch in self._sources():
            await self._take(node, remote_dir, epoch)
            if self.copy.epoch == epoch:
                return

    async def put(self, targets: Sequence[tuple[NodeSession, str]]) -> list[str]:
        """Put the copy onto every (node, backup dir); "NODE: why" for each that could not take it."""
        return await self.copy.put(targets)

    async def stop(self) -> None:
        if self._copying is not None:
            self._copying.cancel()
            await asyncio.gather(self._copying, return_exceptions=True)

    async def _take(self, node: NodeSession, remote_dir: str, epoch: int) -> None:
        said = self.copy.refused
        for _ in range(MID_SAVE_TRIES):
            problem = await self.copy.take(node, remote_dir, epoch)
            if problem != MID_SAVE:
                break
            await asyncio.sleep(MID_SAVE_WAIT_S)  # the save it caught ends within moments
        if self.copy.refused:
            if problem != said:
                self._say(problem)  # the cap, said once
        elif problem and not self._failing:  # said once a streak: the next epoch's copy tries again
            why = f"the chief was saving it at each of {MID_SAVE_TRIES} tries" if problem == MID_SAVE else problem
            held = f"epoch {self.copy.epoch}" if self.copy.epoch is not None else "none yet"
            self._say(f"could not copy the chief's {self.copy.what} of epoch {epoch} off {node.name}: {why} (the "
                      f"copy holds {held}; the next epoch's copy tries again)")
        self._failing = bool(problem)
