"""A node's files without SFTP: the same four operations as exec'd commands (sh, mkdir, find, tar).

For a node where SFTP cannot work: Debian's `Subsystem sftp /usr/lib/openssh/sftp-server` is started
through the user's login shell, and a shell that prints (an `echo` in ~/.bashrc) corrupts the SFTP
stream ("Max packet size exceeded"). Commands do not mind: their output starts after homegpu's marker
(transport.OUTPUT_MARK). Each function takes the transport's own `run` and `start`.
"""

from __future__ import annotations

import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path

from homegpu.remote.nodes.transport_base import CommandResult, NodeTransport, TransportError

# `find` prints each regular file as "PATH\0SIZE\0MTIME\0", relative to the folder (GNU find: Linux nodes).
_FIND = 'test -d "$1" || exit 0; d=$1; shift; exec find "$d" -mindepth 1 "$@"'
_FILE_FORMAT = "%P\\0%s\\0%T@\\0"


def _failed(what: str, result: CommandResult) -> TransportError:
    detail = (result.stderr.strip().splitlines() or [f"exit {result.exit_status}"])[-1]
    return TransportError(f"{what}: {detail}")


async def home_dir(transport: NodeTransport) -> str:
    result = await transport.run(["sh", "-c", "cd && pwd -P"])
    if not result.ok or not result.stdout.strip():
        raise _failed("cannot ask for the home directory", result)
    return result.stdout.strip()


async def makedirs(transport: NodeTransport, path: str) -> None:
    result = await transport.run(["mkdir", "-p", "--", path])
    if not result.ok:
        raise _failed(f"cannot create {path}", result)


def find_argv(remote_dir: str, skip: frozenset[str]) -> list[str]:
    """The command listing the regular files under `remote_dir`, pruning entries named in `skip`."""
    prune: list[str] = []
    for name in sorted(skip):
        prune += [*(["-o"] if prune else []), "-name", name]
    pruned = ["(", *prune, ")", "-prune", "-o"] if prune else []
    return ["sh", "-c", _FIND, "sh", remote_dir, *pruned, "-type", "f", "-printf", _FILE_FORMAT]


def parse_find(output: str) -> dict[str, tuple[int, int]]:
    fields = output.split("\0")
    return {path: (int(size), int(float(mtime)))
            for path, size, mtime in zip(fields[0::3], fields[1::3], fields[2::3])}


async def list_tree(transport: NodeTransport, remote_dir: str, skip: frozenset[str]) -> dict[str, tuple[int, int]]:
    result = await transport.run(find_argv(remote_dir, skip))
    if not result.ok:
        raise _failed(f"cannot list {remote_dir}", result)
    return parse_find(result.stdout)


async def get_tree(transport: NodeTransport, remote_dir: str, local_dir: Path) -> None:
    """Copy a folder (or one file) from the node as tar's stream, extracted with tarfile's `data` filter
    (no absolute paths, links out of the tree or device files from a node)."""
    parent, name = posixpath.split(remote_dir.rstrip("/"))
    local_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=local_dir.parent, prefix=".fetch-") as scratch:
        archive = Path(scratch) / "tree.tar"
        process = await transport.start(["tar", "-C", parent or "/", "-cf", "-", "--", name])
        try:
            with open(archive, "wb") as out:
                while chunk := await process.read_chunk():
                    out.write(chunk)
            status = await process.wait()
        finally:
            await process.close()
        if status != 0:
            errors = (await process.stderr_text()).strip().splitlines()
            raise TransportError(f"file transfer failed: {errors[-1] if errors else f'tar exit {status}'}")
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        _move_into(Path(scratch) / name, local_dir)


def _move_into(source: Path, target: Path) -> None:
    """`source` copied to `target`, merged into a folder already there, as SFTP's recursive get does."""
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)
