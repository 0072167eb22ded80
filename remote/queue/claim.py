"""One serve per cluster file: the first thing serve does is claim its cluster, before it opens its history,
its queue or any SSH session, so that a second serve started on the same cluster file is refused having
touched nothing of the running one's.

The claim is an exclusive flock on the queue socket's folder (rendezvous.py: /tmp/homegpu-queue-HASH, 0700,
one per cluster file): the kernel drops it when serve ends however it ends (SIGKILL, a crash), so a stale
claim never blocks a restart, and two serves starting at the same moment cannot both win.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from homegpu.remote.queue.entries import QueueError
from homegpu.remote.queue.rendezvous import private_folder


class ServeClaim:
    """Held while serve runs: `with ServeClaim(socket_path(spec).parent): ...`.

    Raises (on enter):
        QueueError: another serve holds the claim, or the folder is not ours (one line each).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self._fd: int | None = None

    def __enter__(self) -> ServeClaim:
        private_folder(self.folder)
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise QueueError(f"another homegpu serve already runs this cluster (it holds {self.folder}); stop it "
                             "first, or use it: homegpu submit, queue and cancel reach it") from None
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # the lock goes with the descriptor
            self._fd = None
