"""Mirror a local directory onto a node, as `rsync -a --delete` would, sending only what changed.

One process per sync on the node, under the node's own Python (node_side/scripts/tree_sync.py's source, nothing
installed there): it lists the whole tree as one JSON line, we compare it with ours by size,
modification second and mode bits (rsync's quick check), then stream the plan (removals, new
directories) and every changed file down its stdin, in bounded chunks with flow control. The node
renames each file into place with our mtime and mode, so an unchanged file never travels twice, and
a resync with nothing changed costs one round trip. The `local` node works the same way through a
subprocess. Editing a training script therefore never needs a new image: the next launch ships it.

The tree is read once for all nodes (read_tree), less what a CodeFilter leaves out (homegpu's own
output, the code dir's ignore files); what it leaves out is left alone on the nodes too.
`shipping_line` says what a sync ships, so a code dir that holds a dataset is noticed at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from homegpu.remote.jobs.code_filter import IGNORE_FILE
from homegpu.remote.node_side import scan, script
from homegpu.remote.nodes import NODE_GONE, NodeSession, RemoteProcess, TransportError, format_bytes

# Never sent, and left alone on the node: "_homegpu" is where homegpu's own trainer package lands beside the job's code.
SKIP_DIRS = frozenset({"__pycache__", ".git", ".venv", ".mypy_cache", ".pytest_cache", "_homegpu"})
CHUNK = 1 << 20  # bytes read from a file and handed to the connection at a time
SECOND = 10**9
OUTCOME_WAIT = 30.0  # seconds for the node's process to finish once it has all its input
NAME_LARGEST_ABOVE = 5_000_000  # bytes: a bigger code dir's summary names its largest folders
LARGEST_NAMED = 3

# {relative path: [size, mtime_ns, mode bits]} and [relative directory], as tree_sync.scan lists them
Tree = tuple[dict[str, list[int]], list[str]]


class SyncError(Exception):
    pass


@dataclass(frozen=True)
class LocalTree:
    """A local tree as read once for every node it goes to: its files ([size, mtime_ns, mode bits],
    a racy one's mtime a second early: see settle_racy) and directories, and what the sync leaves out
    (`leaves_out(rel, is_dir)`: also left alone on the nodes; None: the built-in skips alone)."""

    root: Path
    files: dict[str, list[int]]
    dirs: list[str]
    racy: frozenset[str] = frozenset()
    leaves_out: Callable[[str, bool], bool] | None = None

    def node_tree(self, files: dict[str, list[int]], dirs: list[str]) -> Tree:
        """A node's listing less what this sync leaves out, so that the plan neither removes it
        there nor counts it as missing here (rsync's --exclude without --delete-excluded)."""
        if self.leaves_out is None:
            return files, dirs
        return ({rel: entry for rel, entry in files.items() if not self.leaves_out(rel, False)},
                [rel for rel in dirs if not self.leaves_out(rel, True)])


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


async def read_tree(root: Path, leaves_out: Callable[[str, bool], bool] | None = None) -> LocalTree:
    """`root` as every node's sync sends it, less the built-in skips and what `leaves_out` says.
    Raises SyncError."""
    scan_started = time.time()
    try:
        files, dirs = await asyncio.to_thread(scan, str(root), SKIP_DIRS, True, leaves_out)
    except OSError as exc:
        raise SyncError(f"cannot read {root}: {exc}") from None
    return LocalTree(root, files, dirs, settle_racy(files, scan_started), leaves_out)


def shipping_line(tree: LocalTree, nodes: Sequence[str]) -> str:
    """What a sync ships, in one line: `code sync: 1,204 files, 48.2 MB to node1, node2`; above
    NAME_LARGEST_ABOVE bytes, its largest top-level folders (or files) and how to leave some out."""
    sizes: dict[str, int] = {}
    for rel, (size, _, _) in tree.files.items():
        top, slash, _ = rel.partition("/")
        sizes[top + slash] = sizes.get(top + slash, 0) + size
    total = sum(sizes.values())
    count = len(tree.files)
    line = f"code sync: {count:,} file{'' if count == 1 else 's'}, {format_bytes(total)} to {', '.join(nodes)}"
    if total <= NAME_LARGEST_ABOVE:
        return line
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:LARGEST_NAMED]
    named = [(name, size) for name, size in largest if size * 100 >= total] or largest[:1]  # not the crumbs
    listed = ", ".join(f"{name} {format_bytes(size)}" for name, size in named)
    return f"{line} (largest: {listed}); add a {IGNORE_FILE} to leave some out"


async def sync_tree(node: NodeSession, local: Path | LocalTree, remote_root: str) -> SyncResult:
    """Mirror `local` (a tree, or a folder read here as read_tree does) to the absolute
    `remote_root` on `node`. Raises SyncError."""
    tree = local if isinstance(local, LocalTree) else await read_tree(local)
    try:
        process = await node.spawn(node_command(node.spec.python, remote_root))
    except NODE_GONE as exc:
        raise SyncError(f"{node.name}: code sync to {remote_root} failed: {exc}") from None
    try:
        plan, sent = await _converse(process, tree)
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
    return SyncResult(node.name, tuple(sent), tuple(plan.remove), len(tree.files) - len(sent))


async def sync_trees(tree: LocalTree, targets: Sequence[tuple[NodeSession, str]]) -> list[str]:
    """Mirror `tree` onto every (node, remote root) at once.

    Returns:
        A line for each node whose sync failed or that is gone; none: every node has the code.
    """
    results = await asyncio.gather(*(sync_tree(node, tree, root) for node, root in targets),
                                   return_exceptions=True)
    problems = [str(r) for r in results if isinstance(r, (SyncError, *NODE_GONE))]
    bug = next((r for r in results if isinstance(r, BaseException)), None)
    if bug is not None and not problems:  # not a sync's failure: a bug, not a node's line
        raise bug
    return problems


async def _converse(process: RemoteProcess, tree: LocalTree) -> tuple[SyncPlan | None, list[str]]:
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
    plan = plan_sync((tree.files, tree.dirs), tree.node_tree(listing["files"], listing["dirs"]), tree.racy)
    sent: list[str] = []
    if plan.upload or plan.remove or plan.mkdirs or plan.rmdirs:
        process.write(plan.node_line())
        sent = await _send_files(process, tree.root, tree.files, plan.upload)
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
