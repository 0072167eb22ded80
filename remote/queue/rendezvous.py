"""Where serve listens for the queue's commands: a Unix socket, 0600, in a folder only serve's user may
enter (0700), one per cluster file: /tmp/homegpu-queue-HASH/queue.sock, HASH as the history's (the cluster
file's absolute path), so everyone who uses that cluster file finds the same serve, and only its user gets in.

A folder that is there already must be a folder of ours that nobody else may enter: another user could
have made it first to catch what is sent (the way tmux and ssh-agent check theirs). A clean stop removes it
with the socket, so /tmp keeps no folder per cluster file serve ever ran.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from homegpu.remote.config import ClusterSpec
from homegpu.remote.history import history_path
from homegpu.remote.queue.entries import QueueError

SOCKET_NAME = "queue.sock"
SOCKET_ROOT = Path("/tmp")  # not $TMPDIR or $XDG_RUNTIME_DIR: every user of the cluster file must find it


def socket_path(spec: ClusterSpec) -> Path:
    digest = history_path(spec).stem.rsplit("-", 1)[-1]
    return SOCKET_ROOT / f"homegpu-queue-{digest}" / SOCKET_NAME


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def owner_of(path: Path) -> str:
    """Who owns `path` ("alice"), or "" when it cannot be told."""
    try:
        return user_name(path.stat().st_uid)
    except OSError:
        return ""


def private_folder(folder: Path) -> None:
    """Make `folder` (0700), or check the one there is ours and closed to others.

    Raises:
        QueueError: it is not a folder, not ours, or open to others; one line saying what to do.
    """
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise QueueError(f"cannot make {folder} for the queue's socket ({exc.strerror}); check /tmp") from None
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise QueueError(f"{folder} is not a folder; remove it and start serve again")
    if info.st_uid != os.getuid():
        raise QueueError(f"{folder} belongs to {user_name(info.st_uid)}, who may be running serve for this cluster "
                         f"file; if not, have it removed (rm -r {folder}) and start serve again")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # ours: close it rather than refuse (a umask, an old copy)


def remove_private_folder(folder: Path) -> None:
    """Remove the socket's folder once the socket is gone: only ours, and only while it is empty (what
    someone else put there stays, and its folder with it)."""
    try:
        if os.lstat(folder).st_uid == os.getuid():
            os.rmdir(folder)
    except OSError:
        pass  # gone already, not empty, or not ours
