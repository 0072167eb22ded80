"""Mirror a local directory onto a node, sending only files that changed.

The node's files are listed over SFTP (no shell, no Python started on the node) and compared with
the local ones by size and modification time, rsync's quick check; uploads keep the local mtime,
so an unchanged file is never sent twice. Files the local tree no longer has are removed. Editing
a training script therefore never needs a new image: the next launch ships just that file.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from homegpu.remote.node import NODE_GONE, NodeSession
from homegpu.remote.transport import local_tree

SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache"})


class SyncError(Exception):
    pass


@dataclass(frozen=True)
class SyncResult:
    node: str
    uploaded: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: int


def plan_sync(local: dict[str, tuple[int, int]], remote: dict[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """(files to upload, files to remove) so that remote mirrors local."""
    upload = sorted(rel for rel, stamp in local.items() if remote.get(rel) != stamp)
    remove = sorted(rel for rel in remote if rel not in local)
    return upload, remove


async def sync_tree(node: NodeSession, local_root: Path, remote_root: str) -> SyncResult:
    """Mirror `local_root` to the absolute `remote_root` on `node`. Raises SyncError."""
    try:
        remote = await node.list_tree(remote_root, SKIP_DIRS)
        local = local_tree(local_root, SKIP_DIRS)
        upload, remove = plan_sync(local, remote)
        if upload:
            await node.put_files([(local_root / rel, posixpath.join(remote_root, rel)) for rel in upload])
        if remove:
            await node.remove_files([posixpath.join(remote_root, rel) for rel in remove])
    except NODE_GONE as exc:
        raise SyncError(f"{node.name}: code sync to {remote_root} failed: {exc}") from None
    return SyncResult(node.name, tuple(upload), tuple(remove), len(local) - len(upload))
