"""Mirror a local directory onto a node, as `rsync -a --delete` would, sending only what changed.

One process per sync on the node, under the node's own Python (node_side/tree_sync.py's source, nothing
installed there): it lists the whole tree as one JSON line, we compare it with ours by size,
modification second and mode bits (rsync's quick check), then stream the plan (removals, new
directories) and every changed file down its stdin, in bounded chunks with flow control. The node
renames each file into place with our mtime and mode, so an unchanged file never travels twice, and
a resync with nothing changed costs one round trip. The `local` node works the same way through a
subprocess. Editing a training script therefore never needs a new image: the next launch ships it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from homegpu.remote.node_side import scan, script
from homegpu.remote.nodes import NODE_GONE, NodeSession, RemoteProcess, TransportError

# Never sent, and left alone on the node: "_homegpu" is where homegpu's own trainer package lands beside the job's code.
SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", "_homegpu"})
CHUNK = 1 << 20  # bytes read from a file and handed to the connection at a time
SECOND = 10**9
OUTCOME_WAIT = 30.0  # seconds for the node's process to finish once it has all its input

# {relative path: [size, mtime_ns, mode bits]} and [relative directory], as tree_sync.scan lists them
Tree = tuple[dict[str, list[int]], list[str]]


class SyncError(Exception):
    pass


@dataclass(frozen=True)
class SyncResult:
    node: str
    uploaded: tuple[str, ...]
    removed: tuple[str, ...]
    unchanged: int


@dataclass(frozen=True)
class SyncPlan:
    upload: list[str]
    remove: list[str]
    mkdirs: list[str]
    rmdirs: list[str]

    def node_line(self) -> bytes:
        """The plan as the node reads it: one JSON line (the files follow it on the stream)."""
        plan = {"remove": self.remove, "mkdirs": self.mkdirs, "rmdirs": self.rmdirs}
        return json.dumps(plan).encode() + b"\n"


def plan_sync(local: Tree, remote: Tree, racy: frozenset[str] = frozenset()) -> SyncPlan:
    """What makes `remote` mirror `local`: files whose size, mtime second or mode differ (and every
    `racy` one), files and directories the local tree lacks (deepest first), directories it adds."""
    (local_files, local_dirs), (remote_files, remote_dirs) = local, remote

    def stamp(entry: list[int] | None) -> tuple[int, int, int] | None:
        return None if entry is None else (entry[0], entry[1] // SECOND, entry[2])

    upload = sorted(rel for rel, entry in local_files.items()
                    if rel in racy or stamp(entry) != stamp(remote_files.get(rel)))
    remove = sorted(set(remote_files) - set(local_files))
    mkdirs = sorted(set(local_dirs) - set(remote_dirs))
    rmdirs = sorted(set(remote_dirs) - set(local_dirs), reverse=True)  # a child sorts after its parent
    return SyncPlan(upload, remove, mkdirs, rmdirs)


def settle_racy(files: dict[str, list[int]], scan_started: float) -> frozenset[str]:
    """Files modified in the second the scan began (or later), whose stored mtime is moved back a second.

    Compared by the second, such a file could change again after we read it and still match what
    we sent (git calls this "racy"); stored a second early, the next sync sends it again instead.
    """
    racy = frozenset(rel for rel, entry in files.items() if entry[1] // SECOND >= int(scan_started))
    for rel in racy:
        files[rel][1] -= SECOND
    return racy


def node_command(python: str, remote_root: str) -> list[str]:
    """The argv that lists `remote_root` on the node and then applies what its stdin says."""
    return [python, "-c", script("tree_sync"), remote_root, *sorted(SKIP_DIRS)]


async def sync_tree(node: NodeSession, local_root: Path, remote_root: str) -> SyncResult:
    """Mirror `local_root` to the absolute `remote_root` on `node`. Raises SyncError."""
    scan_started = time.time()
    try:
        local = await asyncio.to_thread(scan, str(local_root), SKIP_DIRS, True)
    except OSError as exc:
        raise SyncError(f"cannot read {local_root}: {exc}") from None
    racy = settle_racy(local[0], scan_started)
    try:
        process = await node.spawn(node_command(node.spec.python, remote_root))
    except NODE_GONE as exc:
        raise SyncError(f"{node.name}: code sync to {remote_root} failed: {exc}") from None
    try:
        plan, sent = await _converse(process, local_root, local, racy)
        status, detail = await _outcome(process)
    except (*NODE_GONE, ConnectionError) as exc:  # the link died, or the node's process ended early
        status, detail = await _outcome(process)
        raise SyncError(f"{node.name}: code sync to {remote_root} failed: {detail or exc}") from None
    except OSError as exc:  # a local file we cannot read: close() below ends the node's process
        raise SyncError(f"{node.name}: code sync to {remote_root} stopped: {exc}") from None
    finally:
        await process.close()
    if status != 0 or plan is None:
        raise SyncError(f"{node.name}: code sync to {remote_root} with {node.spec.python} failed "
                        f"(status {status}): {detail or 'no listing came back'}")
    return SyncResult(node.name, tuple(sent), tuple(plan.remove), len(local[0]) - len(sent))


async def sync_trees(local_root: Path, targets: Sequence[tuple[NodeSession, str]]) -> list[str]:
    """Mirror `local_root` onto every (node, remote root) at once.

    Returns:
        A line for each node whose sync failed or that is gone; none: every node has the code.
    """
    results = await asyncio.gather(*(sync_tree(node, local_root, root) for node, root in targets),
                                   return_exceptions=True)
    problems = [str(r) for r in results if isinstance(r, (SyncError, *NODE_GONE))]
    bug = next((r for r in results if isinstance(r, BaseException)), None)
    if bug is not None and not problems:  # not a sync's failure: a bug, not a node's line
        raise bug
    return problems


async def _converse(process: RemoteProcess, local_root: Path, local: Tree,
                    racy: frozenset[str]) -> tuple[SyncPlan | None, list[str]]:
    """Read the node's listing, send it the plan and the files; (the plan, the files sent), or
    (None, []) when no listing came (the node's Python is missing or failed: its stderr says)."""
    lines = process.raw_lines()
    try:
        listing = json.loads(await anext(lines, b"null"))
    except ValueError:
        listing = None
    finally:
        await lines.aclose()
    if not isinstance(listing, dict):
        process.close_stdin()
        return None, []
    plan = plan_sync(local, (listing["files"], listing["dirs"]), racy)
    sent: list[str] = []
    if plan.upload or plan.remove or plan.mkdirs or plan.rmdirs:
        process.write(plan.node_line())
        sent = await _send_files(process, local_root, local[0], plan.upload)
    process.close_stdin()
    return plan, sent


async def _send_files(process: RemoteProcess, root: Path, files: dict[str, list[int]],
                      upload: list[str]) -> list[str]:
    """Stream each file as a JSON header and its bytes; the files sent (one gone since the scan is
    not). A file that changed size since the scan is cut or zero-padded to the size announced:
    its new size or mtime makes the next sync send it again."""
    sent, pending, pending_size = [], [], 0
    for rel in upload:
        size, mtime_ns, mode = files[rel]
        try:
            source = open(root / rel, "rb")
        except FileNotFoundError:
            continue
        with source:
            pending.append(json.dumps([rel, size, mode, mtime_ns]).encode() + b"\n")
            left = size
            while left:
                chunk = source.read(min(left, CHUNK)) or bytes(min(left, CHUNK))
                pending.append(chunk)
                pending_size += len(chunk)
                left -= len(chunk)
                if pending_size >= CHUNK:
                    process.write(b"".join(pending))
                    pending, pending_size = [], 0
                    await process.drain()
        sent.append(rel)
    process.write(b"".join(pending))
    await process.drain()
    return sent


async def _outcome(process: RemoteProcess) -> tuple[int | None, str]:
    """The node process's exit status and the last line it wrote to stderr ((None, "") when the
    link died, or the process has not ended OUTCOME_WAIT seconds after its input did)."""
    try:
        stderr = (await asyncio.wait_for(process.stderr_text(), OUTCOME_WAIT)).strip().splitlines()
        status = await asyncio.wait_for(process.wait(), OUTCOME_WAIT)
    except (TransportError, asyncio.TimeoutError):
        return None, ""
    return status, stderr[-1] if stderr else ""
