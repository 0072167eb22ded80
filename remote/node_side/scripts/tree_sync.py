"""The node's half of code sync: list a tree in one pass, then apply a plan and a stream of files.

The controller runs this file's source on the node as ``PYTHON -c SOURCE ROOT SKIP...`` (stdlib only,
Python 3.8+, nothing written on the node but the synced tree). It prints the tree under ROOT as one
JSON line, then reads from stdin a plan line (files to remove, directories to drop and to create)
followed by the files, each a JSON header ``[path, size, mode, mtime_ns]`` and ``size`` bytes. Each
file lands under a temporary name and is renamed into place, so a reader never sees half a file and a
read-only target is replaced like any other. Stdin closed right after the listing: nothing to do.

The controller imports scan() from here to list its own tree, so both sides list the same way.
"""

from __future__ import annotations

import json
import os
import sys

CHUNK = 1 << 20


def scan(root, skip, follow_links, leave_out=None):
    """(files, dirs) under `root`: files maps a relative path to [size, mtime_ns, mode bits],
    dirs lists relative directory paths; both empty when `root` is missing. Directories named in
    `skip` are left out with all they hold, and so is each path for which `leave_out(rel, is_dir)`
    is true (the controller's ignore rules: a folder left out is never read). `follow_links`: list
    a link to a file as that file (the controller sends what it points to); otherwise a link is
    listed as itself, so the node's copy differs and gets replaced by a regular file. Links to
    directories are never followed."""
    files, dirs = {}, []
    pending = [("", root)]
    while pending:
        prefix, folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            if prefix:
                continue  # removed while we looked
            return files, dirs
        for entry in entries:
            rel = prefix + entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if (is_dir and entry.name in skip) or (leave_out is not None and leave_out(rel, is_dir)):
                continue
            if is_dir:
                dirs.append(rel)
                pending.append((rel + "/", entry.path))
            elif entry.is_file(follow_symlinks=follow_links) or (entry.is_symlink() and not follow_links):
                try:
                    st = entry.stat(follow_symlinks=follow_links)
                except FileNotFoundError:
                    continue  # a dangling link, or a file removed while we looked
                files[rel] = [st.st_size, st.st_mtime_ns, st.st_mode & 0o777]
    return files, dirs


def _target(root, rel):
    """The absolute path of `rel` under `root`, refusing anything that could leave `root`."""
    parts = rel.split("/")
    if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError("refusing unsafe path in the sync stream: %r" % rel)
    return os.path.join(root, *parts)


def _receive(path, size, mode, mtime_ns, stream):
    """Write the next `size` bytes of `stream` to `path` (via a temporary name), with its mode
    and modification time."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, ".%s.homegpu-sync-%d" % (name, os.getpid()))
    try:
        with open(temporary, "wb") as out:
            left = size
            while left:
                chunk = stream.read(min(left, CHUNK))
                if not chunk:
                    raise EOFError("the sync stream ended inside %s" % path)
                out.write(chunk)
                left -= len(chunk)
        os.chmod(temporary, mode)
        os.utime(temporary, ns=(mtime_ns, mtime_ns))
        os.replace(temporary, path)
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


def apply(root, plan, stream):
    """Carry out a plan (removals first, deepest directories first), then receive every file."""
    os.makedirs(root, exist_ok=True)
    for rel in plan["remove"]:
        try:
            os.unlink(_target(root, rel))
        except FileNotFoundError:
            pass
    for rel in plan["rmdirs"]:
        try:
            os.rmdir(_target(root, rel))
        except OSError:
            pass  # it still holds skipped directories (__pycache__, .venv): they stay, as with rsync
    for rel in plan["mkdirs"]:
        os.makedirs(_target(root, rel), exist_ok=True)
    for header in iter(stream.readline, b""):
        rel, size, mode, mtime_ns = json.loads(header)
        _receive(_target(root, rel), size, mode, mtime_ns, stream)


def main(argv):
    root, skip = argv[0], frozenset(argv[1:])
    files, dirs = scan(root, skip, follow_links=False)
    sys.stdout.write(json.dumps({"files": files, "dirs": dirs}) + "\n")
    sys.stdout.flush()
    stream = sys.stdin.buffer
    plan = stream.readline()
    if plan:
        try:
            apply(root, json.loads(plan), stream)
        except (OSError, ValueError, EOFError) as exc:
            sys.stderr.write("code sync into %s failed: %s\n" % (root, exc))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
