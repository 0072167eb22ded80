"""Mirror a local directory onto a node, sending only files whose content changed.

The node lists what it has (path → sha256) with a small stdlib script; files that differ go over
SFTP (or a local copy for `local`), files the local tree no longer has are removed. Editing a
training script therefore never needs a new image: the next launch ships just that file.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path

from homegpu.remote.node import NodeSession

_SKIP_DIRS = {"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache"}

_MANIFEST_SCRIPT = r"""
import hashlib, json, os, sys
root = sys.argv[1]
skip = set(json.loads(sys.argv[2]))
files = {}
for folder, dirs, names in os.walk(root):
    dirs[:] = [d for d in dirs if d not in skip]
    for name in names:
        path = os.path.join(folder, name)
        with open(path, "rb") as handle:
            files[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
print(json.dumps(files))
"""

_REMOVE_SCRIPT = r"""
import os, sys
root = sys.argv[1]
for rel in sys.argv[2:]:
    os.unlink(os.path.join(root, rel))
"""


class SyncError(Exception):
    pass


@dataclass(frozen=True)
class SyncResult:
    node: str
    uploaded: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: int


def local_manifest(root: Path) -> dict[str, str]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not _SKIP_DIRS.intersection(path.relative_to(root).parts):
            files[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def plan_sync(local: dict[str, str], remote: dict[str, str]) -> tuple[list[str], list[str]]:
    """(files to upload, files to remove) so that remote mirrors local."""
    upload = [rel for rel, digest in local.items() if remote.get(rel) != digest]
    remove = [rel for rel in remote if rel not in local]
    return upload, remove


async def sync_tree(node: NodeSession, local_root: Path, remote_root: str) -> SyncResult:
    """Mirror `local_root` to the absolute `remote_root` on `node`. Raises SyncError."""
    python = node.spec.python
    listing = await node.run([python, "-c", _MANIFEST_SCRIPT, remote_root, json.dumps(sorted(_SKIP_DIRS))],
                             timeout=120)
    if not listing.ok:
        raise SyncError(f"{node.name}: cannot list {remote_root}: {listing.stderr.strip()[-300:]}")
    local = local_manifest(local_root)
    upload, remove = plan_sync(local, json.loads(listing.stdout))
    if upload:
        await node.put_files([(local_root / rel, posixpath.join(remote_root, rel)) for rel in upload])
    if remove:
        result = await node.run([python, "-c", _REMOVE_SCRIPT, remote_root, *remove], timeout=120)
        if not result.ok:
            raise SyncError(f"{node.name}: cannot remove stale files: {result.stderr.strip()[-300:]}")
    return SyncResult(node.name, tuple(upload), tuple(remove), len(local) - len(upload))
